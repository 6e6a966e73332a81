//! The command line's grammar: every command and its arguments as clap definitions (a table),
//! and the parsers of sizes and retentions they use. Nothing here runs a command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::time;

#[derive(Parser, Debug)]
#[command(
    name = "redbfs",
    version = version(),
    about = "A transactional redb store mounted as a directory, for AI-agent memory"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// `--version`: this release and the store format it reads (a store of any other format is
/// refused at open), e.g. `0.1.0 (store format 3)`.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let format = crate::store::FORMAT_VERSION;
        format!("{} (store format {format})", env!("CARGO_PKG_VERSION"))
    })
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(super) enum LostUpdatesArg {
    /// Let the replace go through, as a local disk does; log it, count it in status and mark
    /// its history record `conflict`.
    Record,
    /// Fail the replace with EAGAIN (nothing changes), so the tool reads again and retries;
    /// logged, counted and recorded as with `record`.
    Refuse,
    /// Do not track what each process read.
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(super) enum Names {
    /// Linux rules: UTF-8, NFC, no control or invisible format characters.
    Linux,
    /// Also no Windows-reserved characters or names, no trailing dot or space, and no
    /// siblings that differ only in case.
    Portable,
}

#[derive(Subcommand, Debug)]
pub(super) enum Cmd {
    /// Mount a store (created if missing) on MOUNTPOINT; returns once the mount answers.
    Mount(Box<Mount>),
    /// Unmount; returns once the daemon has closed the store.
    Unmount(Unmount),
    /// Promote a live follower to the writer of the replica it follows, without unmounting.
    Promote(Promote),
    /// Show a mount's or a store's state.
    Status(Status),
    /// Check a store's integrity and the filesystem invariants (exit 1 on findings).
    Check(Check),
    /// Write a consistent point-in-time copy of a store (mounted or not) to OUT, or `-` for stdout.
    Snapshot(Snapshot),
    /// Internal: checks a copy a daemon just wrote, in a process of its own.
    #[command(name = "verify-copy", hide = true)]
    VerifyCopy(VerifyCopy),
    /// Replace a store (not mounted) with a checked snapshot, or rebuild it from a replica
    /// (--from), keeping the old one beside it.
    Restore(Restore),
    /// Look at a replica in object storage.
    Replica(Replica),
    /// Write a store's tree, with modes and mtimes, to a new directory or a tar file.
    Export(Export),
    /// Copy a directory's tree, or a tar archive's, into a store (created if missing) in one
    /// transaction.
    Import(Import),
    /// List a directory of a store (mounted or not).
    Ls(Ls),
    /// Print a file of a store (mounted or not).
    Cat(Cat),
    /// Print the tree under a path of a store.
    Tree(Tree),
    /// Files, directories and content bytes under a path of a store.
    Du(Du),
    /// Set, list or clear quotas of directories (one per user of a shared mount, say).
    Quota(Quota),
    /// Counts, largest files, store file size and last commit time.
    Stats(Stats),
    /// Remove memory files neither read nor written since a time (through the mount when mounted).
    Expire(Expire),
    /// Rewrite a store file (not mounted) to give free space back to the disk.
    Compact(Compact),
    /// History records, newest first, for the store or one path (following renames).
    Log(Log),
    /// Print a file as it was at a point of history (a seq, a mark, a date or `2h` ago).
    Show(Show),
    /// A unified diff of a file between two points of history (`--to` defaults to now).
    Diff(Diff),
    /// Label the current point of history.
    Mark(Mark),
    /// Bring one file or directory back to a point of history, in one new transaction.
    Revert(Revert),
    /// Bring the whole store back to a point of history, in one new transaction (undoable).
    Rollback(Rollback),
    /// Erase the content of past versions of a file (all, or the one seen at --at), keeping the
    /// records that they existed. The bytes leave the store file at the next `compact`.
    Redact(Redact),
    /// Print shell completions for bash, zsh, fish, elvish or powershell.
    Completions(Completions),
    /// Print the man page (roff): redbfs(1), or one command's, e.g. `redbfs man mount`.
    Man(Man),
}

#[derive(Args, Debug)]
pub(super) struct Mount {
    pub mountpoint: PathBuf,
    /// The store file [default: MOUNTPOINT.redb beside the mountpoint].
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Stay attached; SIGINT or SIGTERM unmounts cleanly.
    #[arg(long)]
    pub foreground: bool,
    /// Write the daemon's log here, moved to FILE.1 past 16 MiB [default: STORE.log in the
    /// background, stderr in the foreground].
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Let other users enter the mount (permissions are still checked by the kernel).
    #[arg(long)]
    pub allow_other: bool,
    /// Mount read-only: browsing, snapshot and log work; every change gives EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Refuse to execute any file on the mount (mount(2)'s `noexec`).
    #[arg(long)]
    pub noexec: bool,
    /// More log: -v logs every request.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Threads serving kernel requests: 1 to 16 per core (default: one per core, 2 to 4).
    #[arg(long, default_value_t = crate::fuse::default_threads(),
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=max_threads()))]
    pub threads: usize,
    /// Largest file (EFBIG beyond), e.g. 256M. Kept in the store.
    #[arg(long, value_parser = size_in(1, MAX_BYTES))]
    pub max_file_bytes: Option<u64>,
    /// Content all open files may buffer in memory before a writer's buffer moves to a
    /// private temporary file beside the store, e.g. 1G. Kept in the store [default for
    /// a new store: 1G].
    #[arg(long, value_parser = size_in(0, MAX_BYTES))]
    pub max_buffer: Option<u64>,
    /// Total content bytes (ENOSPC beyond), e.g. 10G; 0 for none. Kept in the store.
    #[arg(long, value_parser = size_in(0, MAX_BYTES))]
    pub quota: Option<u64>,
    /// Files plus directories (ENOSPC beyond). Kept in the store.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_FILES))]
    pub max_files: Option<u64>,
    /// Longest path from the mount root, in bytes (ENAMETOOLONG beyond). Kept in the store.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_PATH_BYTES))]
    pub max_path_bytes: Option<usize>,
    /// Deepest path from the mount root, in levels (ELOOP beyond). Kept in the store.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DEPTH))]
    pub max_depth: Option<usize>,
    /// Name rules. Kept in the store.
    #[arg(long, value_enum)]
    pub names: Option<Names>,
    /// What a replace (rename over a file, or open with O_TRUNC) does when the file's
    /// content was changed by another process after this process last read it. Kept in
    /// the store [default for a new store: record].
    #[arg(long, value_enum)]
    pub lost_updates: Option<LostUpdatesArg>,
    /// How long history keeps replaced and deleted content, e.g. 30d; 0 turns history
    /// off. Kept in the store [default for a new store: 30d].
    #[arg(long, value_parser = duration_in(0, MAX_RETENTION_NS))]
    pub keep_history: Option<u64>,
    /// Bytes history may keep, e.g. 4G; past it the oldest records are shed. 0 for the
    /// default. Kept in the store [default: the --quota (at least 16M), or 1G without one].
    #[arg(long, value_parser = size_in(0, MAX_BYTES))]
    pub max_history_bytes: Option<u64>,
    /// Replicate the store continuously to object storage: s3://BUCKET/PREFIX, gs://..,
    /// az://.. (credentials and endpoint from the service's environment, e.g.
    /// AWS_ENDPOINT_URL) or file:///DIR. Repeatable; `none` stops. Kept in the store.
    #[arg(long = "replica", value_name = "URL")]
    pub replica: Vec<String>,
    /// Ship new commits to the replicas at least this often, e.g. 1s. Kept in the store
    /// [default: 1s].
    #[arg(long, value_parser = duration_in(MS, DAY))]
    pub replica_interval: Option<u64>,
    /// Start a new replica generation (a full snapshot) this often, e.g. 24h. Kept in the
    /// store [default: 24h].
    #[arg(long, value_parser = duration_in(1_000 * MS, 366 * DAY))]
    pub replica_snapshot_every: Option<u64>,
    /// Remove replica generations replaced longer ago than this, e.g. 7d. Kept in the store
    /// [default: 7d].
    #[arg(long, value_parser = duration_in(0, MAX_RETENTION_NS))]
    pub replica_keep: Option<u64>,
    /// Take the replicas' writer role over from the writer that holds it (one writer per
    /// replica URL): on a follower's store, or one restored with `restore --from`. The old
    /// writer is fenced at its next upload.
    #[arg(long, conflicts_with = "follow")]
    pub takeover: bool,
    /// Mount a live read-only copy of the replica at URL (its newest generation, kept
    /// current) instead of a store: the store (--store) is the follower's own private copy.
    #[arg(long, value_name = "URL", conflicts_with_all = ["replica", "read_only"])]
    pub follow: Option<String>,
    /// How often a follower polls its replica, e.g. 1s or 200ms [default: 1s].
    #[arg(long, value_parser = duration_in(10 * MS, DAY), requires = "follow")]
    pub follow_interval: Option<u64>,
    /// (internal) report readiness on this descriptor
    #[arg(long, hide = true)]
    pub notify_fd: Option<i32>,
}

#[derive(Args, Debug)]
pub(super) struct Unmount {
    pub mountpoint: PathBuf,
}

#[derive(Args, Debug)]
pub(super) struct Promote {
    /// The follower's mountpoint.
    pub mountpoint: PathBuf,
    /// Ship new commits to the replica at least this often, e.g. 1s [default: 1s].
    #[arg(long, value_parser = duration_in(MS, DAY))]
    pub replica_interval: Option<u64>,
}

#[derive(Args, Debug)]
pub(super) struct Status {
    /// A mountpoint or a store file.
    pub target: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Check {
    /// A store file or a mountpoint.
    pub target: PathBuf,
    /// Reclaim orphans and unreachable inodes and fix link counts (unmounted stores only).
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct VerifyCopy {
    pub path: PathBuf,
    /// What each table of the copy must hold: `name:entries:bytes:crc32c`, in order.
    #[arg(long = "table")]
    pub tables: Vec<String>,
}

#[derive(Args, Debug)]
pub(super) struct Snapshot {
    /// A store file or a mountpoint.
    pub source: PathBuf,
    pub out: PathBuf,
    /// The store as it was at a point of history: a seq, a mark, a date or `2h` (ago).
    #[arg(long)]
    pub at: Option<String>,
    /// Only this directory: a store whose root holds what lies below it (no history).
    #[arg(long)]
    pub path: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Restore {
    /// SNAPSHOT STORE, or with --from only STORE.
    #[arg(required = true, num_args = 1..=2, value_name = "[SNAPSHOT] STORE")]
    pub paths: Vec<PathBuf>,
    /// Rebuild the store from this replica (see `mount --replica`) instead of a snapshot.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// With --from: the state after this commit number, or at this time (a date, or `2h`
    /// ago) [default: the last commit the replica holds].
    #[arg(long, requires = "from")]
    pub at: Option<String>,
    /// Do not keep the replaced store as STORE.before-restore-<time>.
    #[arg(long)]
    pub discard_current: bool,
    /// With --from: when the replica's chain stops verifying (a segment missing or damaged)
    /// before what it lists, restore the last commit that verifies instead of failing.
    #[arg(long, requires = "from")]
    pub to_last_verified: bool,
    /// With --from: restore from this generation (as `replica ls` names it), not the newest
    /// one; needed to restore an older generation when a newer one cannot be read.
    #[arg(long, requires = "from", value_name = "GENERATION")]
    pub generation: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Replica {
    #[command(subcommand)]
    pub cmd: ReplicaCmd,
}

#[derive(Subcommand, Debug)]
pub(super) enum ReplicaCmd {
    /// List a replica's generations: when each started, the commits it restores (every
    /// segment read and verified) and where its chain breaks.
    Ls(ReplicaLs),
    /// Verify a replica: every generation's manifest, snapshot and segments, in order. One
    /// line per finding; exit 1 on any.
    Verify(ReplicaVerify),
}

#[derive(Args, Debug)]
pub(super) struct ReplicaVerify {
    /// s3://BUCKET/PREFIX, gs://.., az://.. or file:///DIR
    pub url: String,
    /// Only this generation (as `replica ls` names it).
    #[arg(long)]
    pub generation: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct ReplicaLs {
    /// s3://BUCKET/PREFIX, gs://.., az://.. or file:///DIR
    pub url: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Export {
    /// A store file or a mountpoint.
    pub store: PathBuf,
    /// The directory to create.
    pub dir: Option<PathBuf>,
    /// Write a tar archive instead (`-` for stdout).
    #[arg(long)]
    pub tar: Option<PathBuf>,
    /// Export only this path of the store.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Give files and directories their recorded owners (root only); only then are setuid
    /// and setgid bits kept.
    #[arg(long)]
    pub same_owner: bool,
    /// Replace an existing --tar FILE (a symlink there is replaced, never followed).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
#[command(allow_missing_positional = true)]
pub(super) struct Import {
    /// The directory to copy (or give --tar FILE instead).
    #[arg(required_unless_present = "tar", conflicts_with = "tar")]
    pub dir: Option<PathBuf>,
    /// A store file or a mountpoint.
    pub store: PathBuf,
    /// Where in the store to put it.
    #[arg(long, default_value = "/")]
    pub into: String,
    /// Fail instead of skipping names, symlinks or files the store refuses.
    #[arg(long)]
    pub strict: bool,
    #[arg(long)]
    pub json: bool,
    /// Copy the files and directories of this tar archive instead of a directory.
    #[arg(long, value_name = "FILE")]
    pub tar: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(super) struct Ls {
    pub store: PathBuf,
    #[arg(default_value = "/")]
    pub path: String,
    /// Long listing: mode, size, modification time.
    #[arg(short = 'l')]
    pub long: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Cat {
    pub store: PathBuf,
    pub path: String,
    /// `{"content": ...}` (or `content_hex` for bytes that are not UTF-8).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Tree {
    pub store: PathBuf,
    #[arg(default_value = "/")]
    pub path: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Du {
    pub store: PathBuf,
    #[arg(default_value = "/")]
    pub path: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Quota {
    /// A store file or a mountpoint.
    pub store: PathBuf,
    /// The directory whose quota to set or clear [default: list every quota].
    pub path: Option<String>,
    /// Content bytes allowed below the directory, e.g. 10M (EDQUOT beyond).
    #[arg(long, value_parser = parse_size, requires = "path")]
    pub bytes: Option<u64>,
    /// Files and directories allowed below the directory (EDQUOT beyond).
    #[arg(long, requires = "path")]
    pub files: Option<u64>,
    /// Remove the directory's quota.
    #[arg(long, requires = "path", conflicts_with_all = ["bytes", "files"])]
    pub clear: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Stats {
    pub store: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Expire {
    pub store: PathBuf,
    /// e.g. 30d, 12h, 2w.
    #[arg(long, conflicts_with = "before", required_unless_present = "before")]
    pub unused_for: Option<String>,
    /// e.g. 2026-01-31 or 2026-01-31T08:00:00Z (UTC).
    #[arg(long)]
    pub before: Option<String>,
    /// Only the files under this path.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Print what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Compact {
    pub store: PathBuf,
}

#[derive(Args, Debug)]
pub(super) struct Log {
    pub store: PathBuf,
    pub path: Option<String>,
    /// Only records since then: a date, `2h` (ago), a seq or a mark.
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many records.
    #[arg(short = 'n', long)]
    pub limit: Option<u64>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(super) struct Show {
    pub store: PathBuf,
    pub path: String,
    #[arg(long)]
    pub at: String,
}

#[derive(Args, Debug)]
pub(super) struct Diff {
    pub store: PathBuf,
    pub path: String,
    #[arg(long)]
    pub from: String,
    #[arg(long)]
    pub to: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct Mark {
    pub store: PathBuf,
    pub name: String,
}

#[derive(Args, Debug)]
pub(super) struct Revert {
    pub store: PathBuf,
    pub path: String,
    #[arg(long)]
    pub to: String,
}

#[derive(Args, Debug)]
pub(super) struct Rollback {
    pub store: PathBuf,
    #[arg(long)]
    pub to: String,
    /// Only this directory's tree (as it was then); the rest of the store is untouched.
    #[arg(long)]
    pub path: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct Redact {
    pub store: PathBuf,
    pub path: String,
    #[arg(long)]
    pub at: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct Completions {
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(super) struct Man {
    /// A command, for its own page redbfs-COMMAND(1) [default: redbfs(1)].
    pub command: Option<String>,
    /// Write every page (redbfs.1 and redbfs-COMMAND.1) into this directory instead.
    #[arg(long, conflicts_with = "command")]
    pub out_dir: Option<PathBuf>,
}

// Bounds of the numeric options. A value outside is refused by clap, naming the option: a
// mistyped `-o threads=100000000` must not start a daemon that allocates gigabytes, and a
// retention or size past what i64 nanoseconds or file offsets hold must not wrap.

/// Sizes: 1 PiB, far beyond any disk a store lives on, and within a file offset (i64).
const MAX_BYTES: u64 = 1 << 50;
/// Files plus directories: 2^40, as many inodes as a store could hold on such a disk.
const MAX_FILES: u64 = 1 << 40;
/// A path from the mount root: 64 KiB, 16 times Linux's PATH_MAX.
const MAX_PATH_BYTES: u64 = 64 << 10;
/// Levels below the mount root: import and export hold one descriptor per level.
const MAX_DEPTH: u64 = 1024;
const MS: u64 = 1_000_000;
const DAY: u64 = 86_400 * 1_000 * MS;
/// Retentions: 100 years (i64 nanoseconds end at 292).
const MAX_RETENTION_NS: u64 = 36_500 * DAY;

/// Threads serving kernel requests: 16 per core at most (each has its own buffer of a full
/// request, and beyond that they only contend for the store's single writer).
fn max_threads() -> u64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    16 * cores as u64
}

/// A size (`parse_size`) between `lo` and `hi` bytes.
fn size_in(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |s| {
        let v = parse_size(s)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{v} bytes is out of range: {lo} to {hi} (1P)"))
        }
    }
}

/// A duration such as `30d`, `12h`, `200ms` or `0`, in nanoseconds, between `lo` and `hi`.
fn duration_in(lo: u64, hi: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |s| {
        let ns = if s.trim() == "0" {
            0
        } else {
            time::duration_ns(s)? as u64
        };
        if (lo..=hi).contains(&ns) {
            Ok(ns)
        } else {
            Err(format!(
                "{s:?} is out of range: {} to {}",
                span(lo),
                span(hi)
            ))
        }
    }
}

/// `ns` as the largest whole unit that says it: `0`, `200ms`, `1s`, `366d`.
fn span(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n % DAY == 0 => format!("{}d", n / DAY),
        n if n % (1_000 * MS) == 0 => format!("{}s", n / (1_000 * MS)),
        n => format!("{}ms", n / MS),
    }
}

/// Parses sizes such as `4096`, `64K`, `256M`, `10G`, `1T` (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s:?}: unknown size suffix (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (examples: 4096, 64K, 256M, 10G)"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert!(parse_size("10X").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
