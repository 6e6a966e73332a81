//! Operations on a store file, outside the filesystem's request path, one module per family:
//! `inspection` (ls, cat, du, stats), `backup` (snapshot, restore, verify), `transfer`
//! (export and import, of a directory or a tar archive), `maintenance` (expiry, repair) and
//! `history` (log, show, diff of a point). `common` holds what they share (an entry, the walk
//! of a tree, a file's content, durations and dates); no family imports another. `request`
//! answers the JSON requests of the control socket and the CLI by calling the families. The
//! CLI runs them on an unmounted store directly and the daemon runs the read-only ones for a
//! mounted store, so both give the same answers.

mod backup;
mod common;
mod history;
mod inspection;
mod maintenance;
mod request;
mod transfer;

pub use backup::{
    CHECKED_HERE_MAX_INODES, COPY_CHECK_CACHE_MAX, SnapshotInfo, check_copies_apart, restore,
    restore_dropping, restore_on, snapshot, snapshot_subtree, verify, verify_copy_args,
    verify_copy_capped,
};
pub use common::{
    ContentSink, EntryInfo, STREAM_CHUNKS, WALK_BATCH, Walk, lookup_path, parse_date,
    parse_duration, read_content, stream_content, tree,
};
pub use history::{
    DIFF_MAX_BYTES, LOG_PAGE_MAX, LogPage, LogQuery, at_point, diff, log_page, log_pages,
    resolve_point, show_at, stream_show,
};
pub use inspection::{DuInfo, StatsInfo, cat, du, ls, quotas, stats, stream_cat};
pub use maintenance::{repair, unused_since};
pub use request::{
    WHOLE_CONTENT_MAX, WHOLE_LISTING_MAX, content, content_of, history_change, listing,
    listing_key, query,
};
pub use transfer::{
    ExportOptions, ExportReport, ImportReport, export_dir, export_tar, import, import_tar,
};
