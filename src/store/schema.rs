//! The store's tables and the byte layout of every record: the one place that says what is on
//! disk. Encodings are explicit little-endian layouts with a leading version byte, written by
//! hand, so the file format does not depend on the compiler's layout or the machine's endianness.
//!
//! # Tables (format version 9)
//!
//! ```text
//! meta     &str            -> &[u8]     "format" u32: the store format version (FORMAT_VERSION)
//!                                       "next_ino" u64: next inode number; never reused
//!                                       "next_blob" u64: next blob id; never reused
//!                                       "created" i64: creation time, ns since the epoch
//!                                       "limits" &[u8]: the mount limits as JSON, kept so a
//!                                       restart keeps them
//!                                       "replicas" &[u8]: the replica URLs and their schedule
//!                                       as JSON (`replica::Settings`), kept the same way
//!                                       "replica_generations" &[u8]: JSON object, replica URL
//!                                       -> the generation this store ships to there, written
//!                                       right after the generation starts; a restore removes it
//!                                       "followed" &[u8]: JSON, a follower's replica URL,
//!                                       generation and commit (`replica::follow::Followed`)
//!                                       "fenced" &[u8]: JSON, the replica URLs whose writer
//!                                       role a newer writer took from this store
//!                                       "replica_roles" &[u8]: JSON, URL -> the epoch this
//!                                       store last held there, its host and path
//!                                       "marked" u64: no mark names a later record
//!                                       (`META_MARKED`)
//! inodes   u64 ino         -> &[u8]     an `Inode` record (below); ino 1 is the root
//! dirents  (u64, &str)     -> (u64, u8) (parent ino, NFC name) -> (child ino, kind byte);
//!                                       readdir is a range scan over one parent
//! filemap  (u64, u64)      -> u64       (ino, chunk index) -> blob id; a missing index is a hole
//!                                       (chunk 0 of a file may be held in its inode record
//!                                       instead, never in both: see "Inline content")
//! blobs    u64 blob id     -> &[u8]     u32 CRC-32C of the content (LE), then the chunk's
//!                                       content, at most CHUNK_SIZE bytes (format 3; format 2
//!                                       stored the content alone and is migrated at open); an
//!                                       empty value is a redacted blob. Its content is
//!                                       immutable once written: a write makes a new blob and
//!                                       repoints filemap, so history keeps referencing old
//!                                       blobs without copying them. A version history alone
//!                                       keeps may move, same id and content, into
//!                                       `blob_deltas` as a delta against a later version
//!                                       (format 6, "Delta blobs"); a blob id is in one table
//! orphans  u64 ino         -> ()        unlinked while open; reclaimed at last release or at the
//!                                       next mount
//! blobrefs u64 blob id     -> u64       references to a blob (filemap entries plus history
//!                                       before-images) when there are 2 or more; a blob without
//!                                       an entry has exactly 1, so most commits leave this table
//!                                       alone. The blob is deleted when its count reaches 0
//! history  u64 seq         -> &[u8]     one `HistoryRecord` per committed operation, appended in
//!                                       the operation's own transaction (when history is on):
//!                                       version 3, whole when its entries take at most
//!                                       RECORD_INLINE_BYTES, else its header; version-2
//!                                       headers (format 6 before) and a format-5 store's
//!                                       version-1 records, which hold their undo list, are
//!                                       read as they are
//! history_undo (u64 seq, u32 part) -> &[u8]  a version-2 record's undo entries, in order, in
//!                                       parts 0..n (n in its header) of at most
//!                                       UNDO_PART_BYTES each, so no value grows with the
//!                                       operation: a large record is many parts, each
//!                                       read, copied, logged and shipped on its own (an
//!                                       import that only creates is one `Created` entry
//!                                       for its new tree, see `Undo::Created`)
//! marks    &str name       -> u64       a labelled point: the last history seq when it was made
//! redacted u64 blob id     -> ()        blobs whose content `redact` erased
//! blob_deltas u64 blob id  -> &[u8]     a blob kept as a delta (format 6, "Delta blobs")
//! deltas   (u64 base, u64 blob) -> ()   every delta blob, by its base (format 6): what must
//!                                       be rebuilt before a base's content is erased, and the
//!                                       runs of deltas behind a blob
//! ```
//!
//! History's indexes (format 4; a format-3 store gets them built from `history` at open),
//! written in the same transaction as the record they index and removed with it:
//!
//! ```text
//! history_keys  (&[u8] key, u64 seq) -> &[u8]  every key a record undoes -> that key's
//!                                       before-image (one undo entry, as in the record;
//!                                       an inode image whose inline chunk holds content
//!                                       is kept without it, flagged: the record holds it,
//!                                       see `index_form`).
//!                                       Key: u8 table tag, then big-endian fields:
//!                                       1 inode: ino | 2 dirent: parent, name bytes |
//!                                       3 filemap: ino, chunk index | 4 orphan: ino.
//!                                       A key's value at point S is the before-image of the
//!                                       first record after S that changed it, or the value
//!                                       now if none did: `show`, `diff` and `revert` of one
//!                                       path read the past without replaying history.
//!                                       The inode and chunk keys of an inode the operation
//!                                       handed out, and the entries of a directory it
//!                                       handed out, are left out (`history::index_entries`):
//!                                       no point before it reaches that inode, since inode
//!                                       numbers are never handed out twice. A `Created`
//!                                       entry (tag 9) is never indexed.
//!                                       An empty value refers to the record: the key's
//!                                       before-image is the record's first entry for it
//!                                       (written for a record held in one value, version 3
//!                                       inline; an undo entry is never empty)
//!                                       Two more kinds of row (format 9), each a range of
//!                                       its own above the undo keys, value empty:
//!                                       16 path: path bytes -> every path a record names:
//!                                       `log PATH` (bytes order as the paths do);
//!                                       17 time: big-endian time with its sign bit
//!                                       flipped -> when each record committed: `--since`,
//!                                       and points given as a time
//! ```
//!
//! Formats 4 to 8 kept the path and time rows in tables of their own, `history_paths`
//! (&str path, u64 seq) -> () and `history_times` (i64 time, u64 seq) -> (): three tables
//! each record's commit wrote to instead of one, and redb's commit costs work per table it
//! dirtied. A format-8 store has them moved into `history_keys` at open, in one transaction.
//!
//! More meta keys: "history_next" u64 (next history seq, from 1), "keep_history" u64 (retention
//! in ns; 0 = history off), "log_seq" u64 (the number of the last commit, the sequence number
//! of its write-ahead log record), "log_id" u64 (the id of the log the records after the last
//! durable commit are in; see `wal`), "files", "dirs" and "content_bytes" u64 (the usage counts:
//! files, directories and bytes of file content, updated by every commit that changes them),
//! "last_commit" i64 (when the last transaction committed, ns since the epoch).
//!
//! # Per-directory aggregates and quotas
//!
//! ```text
//! subtree  u64 dir ino     -> &[u8]     a `SubtreeRecord` (below): what lies below the
//!                                       directory, and its quota if it has one. Kept for
//!                                       every directory in the same commit as the change
//!                                       below it; a missing row is an empty directory
//!                                       without a quota, and a missing table a store built
//!                                       before aggregates (they are built once at open)
//! quotas   u64 dir ino     -> ()        the directories whose subtree record carries a quota:
//!                                       an index, so listing quotas (and knowing whether
//!                                       there are any) reads only these; missing: no quotas
//! ```
//!
//! Meta key "subtree_seq" u64: the commit number up to which the aggregates were kept;
//! written by every commit of a build that keeps them, so a store changed by an older build
//! (which leaves it behind "log_seq") has them rebuilt at its next open.
//!
//! `SubtreeRecord`, version 2 (format 8): u8 record version (2), then the fields of
//! version 1 below, in its order, as varints, the two quota fields only when either is set
//! (a directory of 100 files without a quota takes 7 bytes, not 49, so the rows of a few
//! hundred directories share one page). Rows of version 1 are still read, and rewritten as
//! version 2 when their counts next change.
//!
//! `SubtreeRecord`, version 1 (format 7 and before; little-endian, 49 bytes):
//!
//! ```text
//! 0   u8   record version (1)
//! 1   u64  files below the directory (at any depth)
//! 9   u64  directories below it (not counting itself)
//! 17  u64  content bytes of those files
//! 25  u32  an upper bound of the levels of the deepest entry below it, relative to it
//!          ("a/b" is 2; 0 for an empty directory)
//! 29  u32  an upper bound of the bytes of the longest relative path below it ("/a/b" is 4)
//! 33  u64  quota: content bytes allowed below it (0: no limit)
//! 41  u64  quota: files and directories allowed below it (0: no limit)
//! ```
//!
//! Counts are exact; the two bounds may be loose after removals (they only grow with
//! creates and moves in, and an exact walk tightens them), so a rename checks its path
//! limits in O(depth) and walks only when a bound says the limits might be crossed. A row
//! may outlive its directory when it carries a quota (counts then zero): inode numbers are
//! never reused except by history restoring that same directory, which gets its quota back.
//!
//! # Inode record, version 3 (written by format 8)
//!
//! ```text
//! u8       record version (3)
//! u8       flags: 1 = a directory (else a file); then each field that follows because it
//!          is not at its usual value: 2 permission bits, 4 gid, 8 nlink, 16 atime,
//!          32 ctime, 64 crtime (128 is unused: a record with it is refused)
//! varint   permission bits (07777), if flag 2; else 0644 for a file, 0755 for a directory
//! varint   uid
//! varint   gid, if flag 4; else the uid
//! varint   size in bytes (files); 0 for directories
//! varint   nlink, if flag 8; else 1 for a file, 2 for a directory
//! varint   parent ino (the root is its own parent)
//! i64      mtime, ns since the epoch (little-endian)
//! varint   zigzag(atime - mtime), if flag 16; else atime is mtime
//! varint   zigzag(ctime - mtime), if flag 32; else ctime is mtime
//! varint   zigzag(crtime - ctime), if flag 64; else crtime is ctime
//! varint   name length N
//! N        name, UTF-8 (NFC); empty for the root
//! ...      the file's inline chunk, when bytes follow (see "Inline content")
//! ```
//!
//! Version 2 with the kind folded into a flags byte and the usual values left out: a file
//! of mode 0644 whose group is its owner's, with one link, is 4 bytes shorter (5 when the
//! group is above 127), and each time equal to the one it is kept against 1 more, so a
//! memory of 100 bytes costs about 5% less. Versions 1 and 2 are still read
//! everywhere a record is (the tables, history's before-images, a replica's records), and a
//! record is rewritten as version 3 when its inode next changes.
//!
//! # Inode record, version 2 (written by formats 5 to 7; still read)
//!
//! ```text
//! u8       record version (2)
//! u8       kind: 1 file, 2 directory
//! varint   permission bits (07777)
//! varint   uid
//! varint   gid
//! varint   size in bytes (files); 0 for directories
//! varint   nlink
//! varint   parent ino (the root is its own parent)
//! i64      mtime, ns since the epoch (little-endian)
//! varint   zigzag(atime - mtime)
//! varint   zigzag(ctime - mtime)
//! varint   zigzag(crtime - ctime)
//! varint   name length N
//! N        name, UTF-8 (NFC); empty for the root
//! ...      the file's inline chunk, when bytes follow (see "Inline content")
//! ```
//!
//! Varints are LEB128 (seven bits a byte, low first); zigzag maps a signed difference to an
//! unsigned one (0, -1, 1, -2 ...), and differences wrap, so every i64 round-trips. A small
//! file's record is about 40 bytes less than in version 1, which a store of small memories
//! pays once per file.
//!
//! # Inode record, version 1 (format 4 and before; still read, never written)
//!
//! ```text
//! 0   u8   record version (1)
//! 1   u8   kind: 1 file, 2 directory
//! 2   u32  permission bits (07777)
//! 6   u32  uid
//! 10  u32  gid
//! 14  u64  size in bytes (files); 0 for directories
//! 22  u32  nlink
//! 26  u64  parent ino (the root is its own parent)
//! 34  i64  atime, ns since the epoch
//! 42  i64  mtime
//! 50  i64  ctime
//! 58  i64  crtime
//! 66  u16  name length N
//! 68  N    name, UTF-8 (NFC); empty for the root
//! ```
//!
//! A file has exactly one name (no hard links), so `parent` and `name` locate it; directory
//! renames rewrite only the moved directory's own dirent and record.
//!
//! # Inline content (format 5)
//!
//! A version-2 or version-3 record may end with the file's chunk 0, after the name:
//!
//! ```text
//! u8       flags: 1 = redacted (the content was erased: it reads as empty); 2 = the
//!          content is in the history record this index entry indexes (`history_keys`
//!          values only, see `index_form`); 4 = the content is the one the inode held
//!          after the record (history before-images only, see `keep_form`): the
//!          checksum follows, no content (read, no longer written); 8 = the content is
//!          a delta against an inode's content after the record (history before-images
//!          only, see `delta_form`, which gives the bytes after the checksum)
//! u32      CRC-32C of the content (little-endian)
//! ...      the content, to the end of the record, at most INLINE_MAX bytes
//! ```
//!
//! A file's chunk 0 of at most `INLINE_MAX` bytes is kept here (written through
//! `put_chunks`); then the file has no filemap row for chunk 0 and no blob for it. Every
//! other chunk is a blob. The record is one value, so history's before-image of an inode
//! (`Undo::Inode`) carries its content with it: a small file's edit keeps no blob, and
//! undoing the record restores both. A format-4 store (no version-2 records) is valid as it
//! is; at open its small files move into their records, except those history names (a
//! point reads a key's value now when no record after it changed the key).
//!
//! # Delta blobs (format 6)
//!
//! A blob's value is one of three forms, told apart by its first four bytes; full and
//! redacted values are in `blobs`, deltas in `blob_deltas` (small values there share
//! pages, where a value shrunk in place in `blobs` would keep a page of its own):
//!
//! ```text
//! (empty)                      redacted: the content reads as empty
//! u32 CRC-32C of the rest      full: the rest is the content (formats 3 to 6)
//! u32 !CRC-32C of the rest     delta: the complement of the rest's CRC-32C, so no delta
//!                              passes for a full blob, then:
//!     u8   version (1)
//!     u64  base blob id
//!     u8   behind: the longest run of deltas that led to this blob when it became one
//!     ...  a `store::delta`: the CRC-32C and length of the whole content, the lengths of
//!          the base's prefix and suffix it keeps, and the bytes between them
//! ```
//!
//! When a commit leaves a blob to history alone (the chunk it held now holds a new version:
//! the same file's, or that of the file now at its name, as an SDK's write to a temporary
//! file and rename over gives), the blob becomes a delta against that version when that is
//! at most half its size. A delta holds a reference to its base (counted in `blobrefs`, and
//! indexed in `deltas`), so the base lives while it does. Only a full blob is a base, and
//! no run of deltas passes `MAX_DELTA_RUN`, so reading any version takes at most that many
//! blob reads more. Redacting a base first rebuilds its deltas as full blobs.
//! A format-5 store is valid as it is (all its blobs are full); opening it makes the empty
//! `blob_deltas` and `deltas` tables.

use redb::TableDefinition;

/// The longest run of deltas a version is read through (each one more blob read of a small
/// value, and one more copy of the chunk): every 256th version of a chunk is kept whole.
/// With 64 (every 64th whole), the whole copies were half of what an edit of a 20 KB
/// memory kept (1,158 bytes per edit against 588), and the oldest of 255 versions of a
/// 20 KB memory reads in 30 ms, the debug build's whole `redbfs show` included.
pub const MAX_DELTA_RUN: u8 = 255;

/// The store format this build reads and writes. A store of any other version is refused.
pub const FORMAT_VERSION: u32 = 9;
/// The format before history's path and time indexes moved into `history_keys` (tagged
/// rows, see `path_index_key` and `time_index_key`), migrated at open in one transaction:
/// the rows of `history_paths` and `history_times` are copied and those tables deleted.
pub const FORMAT_8: u32 = 8;
/// The format before compact inode and subtree records (inode record version 3, subtree
/// record version 2), migrated at open by stamping the new number: nothing is rewritten,
/// and its records read as they are (each is rewritten in the new form when it next
/// changes). The number changes so that an earlier release refuses a store holding
/// records it cannot read, instead of failing on one.
pub const FORMAT_7: u32 = 7;
/// The format before compact history (record version 3, `Created` entries, key index
/// entries that refer to their record), migrated at open by stamping the new number: nothing
/// is rewritten, and its records read as they are. The number changes so that an earlier
/// release refuses a store holding records it cannot read, instead of failing on one.
pub const FORMAT_6: u32 = 6;
/// The format before delta blobs and history records in parts, migrated at open: the
/// `deltas`, `blob_deltas` and `history_undo` tables are made; no blob or record changes
/// (a format-5 record holds its whole undo list and is read as it is).
pub const FORMAT_5: u32 = 5;
/// The format before inline content, migrated at open (small files move into their records).
pub const FORMAT_WITHOUT_INLINE: u32 = 4;
/// The format before history's indexes, migrated at open (the indexes are built).
pub const FORMAT_WITHOUT_HISTORY_INDEXES: u32 = 3;
/// The format before chunk checksums, migrated at open.
pub const FORMAT_WITHOUT_CHECKSUMS: u32 = 2;

/// Bytes per content chunk. Small memories fit in one chunk; large files stream. A value
/// that fills a redb leaf on its own must leave room for the leaf's header, or redb rounds
/// its page up to the next power of two: at exactly 64 KiB, every full chunk took 128 KiB of
/// the file. 64 bytes less keeps a full chunk's leaf within 64 KiB.
pub const CHUNK_SIZE: u64 = 64 * 1024 - 64;

/// The inode number of the root directory (FUSE's root id).
pub const ROOT_INO: u64 = 1;

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
pub(crate) const DIRENTS: TableDefinition<(u64, &str), (u64, u8)> = TableDefinition::new("dirents");
pub(crate) const FILEMAP: TableDefinition<(u64, u64), u64> = TableDefinition::new("filemap");
pub(crate) const BLOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("blobs");
pub(crate) const ORPHANS: TableDefinition<u64, ()> = TableDefinition::new("orphans");
pub(crate) const BLOBREFS: TableDefinition<u64, u64> = TableDefinition::new("blobrefs");
pub(crate) const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
pub(crate) const HISTORY_UNDO: TableDefinition<(u64, u32), &[u8]> =
    TableDefinition::new("history_undo");
pub(crate) const MARKS: TableDefinition<&str, u64> = TableDefinition::new("marks");
pub(crate) const REDACTED: TableDefinition<u64, ()> = TableDefinition::new("redacted");
pub(crate) const HISTORY_KEYS: TableDefinition<(&[u8], u64), &[u8]> =
    TableDefinition::new("history_keys");
/// History's path index before format 9 (now rows of `history_keys`, `path_index_key`):
/// read only to migrate a store, a follower's snapshot or a log of an earlier format.
pub(crate) const HISTORY_PATHS: TableDefinition<(&str, u64), ()> =
    TableDefinition::new("history_paths");
/// History's time index before format 9 (now rows of `history_keys`, `time_index_key`).
pub(crate) const HISTORY_TIMES: TableDefinition<(i64, u64), ()> =
    TableDefinition::new("history_times");
pub(crate) const SUBTREE: TableDefinition<u64, &[u8]> = TableDefinition::new("subtree");
pub(crate) const QUOTAS: TableDefinition<u64, ()> = TableDefinition::new("quotas");
pub(crate) const DELTAS: TableDefinition<(u64, u64), ()> = TableDefinition::new("deltas");
pub(crate) const BLOB_DELTAS: TableDefinition<u64, &[u8]> = TableDefinition::new("blob_deltas");

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_NEXT_INO: &str = "next_ino";
pub(crate) const META_NEXT_BLOB: &str = "next_blob";
pub(crate) const META_CREATED: &str = "created";
pub const META_LIMITS: &str = "limits";
pub const META_REPLICAS: &str = "replicas";
pub const META_REPLICA_GENERATIONS: &str = "replica_generations";
/// A follower's store: the replica it follows, the generation and the commit it holds (JSON,
/// see `replica::follow::Followed`); a takeover reads it (where the history it continues
/// stands), then removes it.
pub const META_FOLLOWED: &str = "followed";
/// A writer fenced by a newer one: the replica URL, the epoch that took over and the last
/// commit of this store the replica keeps (JSON, see `replica::epoch::Fenced`); until a
/// takeover removes it, this store takes no writer role at that URL.
pub const META_FENCED: &str = "fenced";
/// The writer role this store took last at each replica URL, with the host and path it was
/// taken from (JSON, see `replica::epoch::Roles`): a store taken over while it held the role
/// learns it at its next mount.
pub const META_ROLES: &str = "replica_roles";
pub(crate) const META_HISTORY_NEXT: &str = "history_next";
pub(crate) const META_KEEP_HISTORY: &str = "keep_history";
pub(crate) const META_LOG_SEQ: &str = "log_seq";
pub(crate) const META_LOG_ID: &str = "log_id";
pub(crate) const META_FILES: &str = "files";
pub(crate) const META_DIRS: &str = "dirs";
pub(crate) const META_CONTENT_BYTES: &str = "content_bytes";
pub(crate) const META_LAST_COMMIT: &str = "last_commit";
pub(crate) const META_SUBTREE_SEQ: &str = "subtree_seq";
/// u64: no mark names a later record than this one (the highest seq a mark was given): a
/// rename asks whether a mark falls among the records it would fold in one read, not by
/// reading every mark. Absent: no mark was set since the store was formatted or migrated
/// to format 7, which sets it from the marks there were.
pub(crate) const META_MARKED: &str = "marked";

const INODE_RECORD_VERSION: u8 = 1;
/// The compact record of format 5 to 7, which may also hold the file's chunk 0 (see
/// "Inline content"); still read, no longer written.
const INODE_RECORD_VERSION_COMPACT: u8 = 2;
/// The record this build writes (format 8): version 2 with a flags byte in place of the
/// kind's, and the fields at their usual values left out (see "Inode record, version 3").
const INODE_RECORD_VERSION_FLAGGED: u8 = 3;
/// A version-3 record's flags: a directory (else a file), then each field that is there
/// because it is not at its usual value.
const FIELD_DIR: u8 = 1;
const FIELD_PERM: u8 = 2;
const FIELD_GID: u8 = 4;
const FIELD_NLINK: u8 = 8;
const FIELD_ATIME: u8 = 16;
const FIELD_CTIME: u8 = 32;
const FIELD_CRTIME: u8 = 64;
const FIELDS_KNOWN: u8 = 127;
/// No flag: a field every record holds.
const FIELD_ALWAYS: u8 = 0;

/// The values a version-3 record leaves out for an inode of a kind: a file 0644 with one
/// link, a directory 0755 with two (no subdirectory).
struct Usual {
    perm: u32,
    nlink: u32,
}

impl Usual {
    fn of(kind: Kind) -> Usual {
        match kind {
            Kind::File => Usual {
                perm: 0o644,
                nlink: 1,
            },
            Kind::Dir => Usual {
                perm: 0o755,
                nlink: 2,
            },
        }
    }
}
const INODE_FIXED_LEN: usize = 68;

/// The largest chunk 0 kept in its file's inode record rather than in a blob of its own.
/// Below it, a blob's fixed costs (its key, its filemap row, the rows' entries in two
/// B-trees: about 60 bytes) are a large part of what a memory costs (60% of a 100-byte
/// file); above it they are under 3%. A record of up to about 2.1 KiB still shares a 4 KiB
/// redb leaf with its neighbours, so a stat or a walk reading inode records never meets a
/// page of its own, and a record read for its attributes copies at most this much.
pub const INLINE_MAX: usize = 2048;

/// What an inode is. Only regular files and directories exist in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

impl Kind {
    pub fn to_byte(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
        }
    }

    pub fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::File),
            2 => Some(Kind::Dir),
            _ => None,
        }
    }
}

/// One inode record: what `stat` reports, plus where the inode sits in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub kind: Kind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub parent: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub crtime: i64,
    pub name: String,
}

impl Inode {
    /// The record without an inline chunk.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(None)
    }

    /// The record (version 3), carrying `inline` (an encoded inline chunk: flags, checksum,
    /// content, as `encode_inline` makes it) when given. Fields at their usual values are
    /// left out and named by the flags byte (see "Inode record, version 3").
    pub fn encode_with(&self, inline: Option<&[u8]>) -> Vec<u8> {
        let name = self.name.as_bytes();
        let tail = inline.map_or(0, <[u8]>::len);
        let usual = Usual::of(self.kind);
        let mut flags = 0u8;
        if self.kind == Kind::Dir {
            flags |= FIELD_DIR;
        }
        if self.perm != usual.perm {
            flags |= FIELD_PERM;
        }
        if self.gid != self.uid {
            flags |= FIELD_GID;
        }
        if self.nlink != usual.nlink {
            flags |= FIELD_NLINK;
        }
        if self.atime != self.mtime {
            flags |= FIELD_ATIME;
        }
        if self.ctime != self.mtime {
            flags |= FIELD_CTIME;
        }
        if self.crtime != self.ctime {
            flags |= FIELD_CRTIME;
        }
        let mut out = Vec::with_capacity(40 + name.len() + tail);
        out.push(INODE_RECORD_VERSION_FLAGGED);
        out.push(flags);
        let given = |f: u8| flags & f != 0;
        for (flag, v) in [
            (FIELD_PERM, u64::from(self.perm)),
            (0, u64::from(self.uid)),
            (FIELD_GID, u64::from(self.gid)),
            (0, self.size),
            (FIELD_NLINK, u64::from(self.nlink)),
            (0, self.parent),
        ] {
            if flag == 0 || given(flag) {
                put_varint(&mut out, v);
            }
        }
        out.extend_from_slice(&self.mtime.to_le_bytes());
        for (flag, d) in [
            (FIELD_ATIME, self.atime.wrapping_sub(self.mtime)),
            (FIELD_CTIME, self.ctime.wrapping_sub(self.mtime)),
            (FIELD_CRTIME, self.crtime.wrapping_sub(self.ctime)),
        ] {
            if given(flag) {
                put_varint(&mut out, zigzag(d));
            }
        }
        put_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name);
        if let Some(t) = inline {
            out.extend_from_slice(t);
        }
        out
    }

    /// The record as version 2 wrote it (format 7 and before): every field, the kind in a
    /// byte of its own. Tests make older stores with it.
    #[doc(hidden)]
    pub fn encode_version_2(&self, inline: Option<&[u8]>) -> Vec<u8> {
        let name = self.name.as_bytes();
        let tail = inline.map_or(0, <[u8]>::len);
        let mut out = Vec::with_capacity(48 + name.len() + tail);
        out.push(INODE_RECORD_VERSION_COMPACT);
        out.push(self.kind.to_byte());
        for v in [
            u64::from(self.perm),
            u64::from(self.uid),
            u64::from(self.gid),
            self.size,
            u64::from(self.nlink),
            self.parent,
        ] {
            put_varint(&mut out, v);
        }
        out.extend_from_slice(&self.mtime.to_le_bytes());
        for d in [
            self.atime.wrapping_sub(self.mtime),
            self.ctime.wrapping_sub(self.mtime),
            self.crtime.wrapping_sub(self.ctime),
        ] {
            put_varint(&mut out, zigzag(d));
        }
        put_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name);
        if let Some(t) = inline {
            out.extend_from_slice(t);
        }
        out
    }

    /// Decodes a record (version 1, or 2 or 3 with its inline chunk left aside); `None` when
    /// the bytes are not an inode record.
    pub fn decode(ino: u64, b: &[u8]) -> Option<Inode> {
        parse_record(ino, b).map(|(i, _)| i)
    }
}

/// An inode record's fields and where its name ends (where a version-2 or 3 record's inline
/// chunk starts, when bytes follow); None when the bytes are not an inode record.
fn parse_record(ino: u64, b: &[u8]) -> Option<(Inode, usize)> {
    let (mut i, name, name_end) = parse_borrowed(ino, b)?;
    i.name = name.to_string();
    Some((i, name_end))
}

/// `parse_record` with the name left in the record (the `Inode`'s own is empty): no
/// allocation.
fn parse_borrowed(ino: u64, b: &[u8]) -> Option<(Inode, &str, usize)> {
    match *b.first()? {
        INODE_RECORD_VERSION => {
            if b.len() < INODE_FIXED_LEN {
                return None;
            }
            let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
            let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
            let i64_at = |o: usize| i64::from_le_bytes(b[o..o + 8].try_into().unwrap());
            let name_end = INODE_FIXED_LEN + u16::from_le_bytes([b[66], b[67]]) as usize;
            if b.len() != name_end {
                return None;
            }
            let i = Inode {
                ino,
                kind: Kind::from_byte(b[1])?,
                perm: u32_at(2),
                uid: u32_at(6),
                gid: u32_at(10),
                size: u64_at(14),
                nlink: u32_at(22),
                parent: u64_at(26),
                atime: i64_at(34),
                mtime: i64_at(42),
                ctime: i64_at(50),
                crtime: i64_at(58),
                name: String::new(),
            };
            let name = std::str::from_utf8(&b[INODE_FIXED_LEN..name_end]).ok()?;
            Some((i, name, name_end))
        }
        INODE_RECORD_VERSION_COMPACT => {
            let kind = Kind::from_byte(*b.get(1)?)?;
            parse_varint_fields(ino, b, kind, None)
        }
        INODE_RECORD_VERSION_FLAGGED => {
            let flags = *b.get(1)?;
            if flags & !FIELDS_KNOWN != 0 {
                return None;
            }
            let kind = if flags & FIELD_DIR != 0 {
                Kind::Dir
            } else {
                Kind::File
            };
            parse_varint_fields(ino, b, kind, Some(flags))
        }
        _ => None,
    }
}

/// The fields of a version-2 record (`flags` None: every field is there) or a version-3
/// one (the fields its flags name are there, the others at their usual values), from byte
/// 2 on, with its name (left in the record; the `Inode`'s own is empty) and where it ends.
fn parse_varint_fields(
    ino: u64,
    b: &[u8],
    kind: Kind,
    flags: Option<u8>,
) -> Option<(Inode, &str, usize)> {
    let given = |f: u8| f == FIELD_ALWAYS || flags.is_none_or(|flags| flags & f != 0);
    let usual = Usual::of(kind);
    let mut at = 2;
    let mut next = |f: u8| -> Option<Option<u64>> {
        if given(f) {
            take_varint(b, &mut at).map(Some)
        } else {
            Some(None)
        }
    };
    let perm = match next(FIELD_PERM)? {
        Some(v) => u32::try_from(v).ok()?,
        None => usual.perm,
    };
    let uid = u32::try_from(next(FIELD_ALWAYS)??).ok()?;
    let gid = match next(FIELD_GID)? {
        Some(v) => u32::try_from(v).ok()?,
        None => uid,
    };
    let size = next(FIELD_ALWAYS)??;
    let nlink = match next(FIELD_NLINK)? {
        Some(v) => u32::try_from(v).ok()?,
        None => usual.nlink,
    };
    let parent = next(FIELD_ALWAYS)??;
    let mtime = i64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
    at += 8;
    let mut since = |f: u8, from: i64| -> Option<i64> {
        if given(f) {
            Some(from.wrapping_add(unzigzag(take_varint(b, &mut at)?)))
        } else {
            Some(from)
        }
    };
    let atime = since(FIELD_ATIME, mtime)?;
    let ctime = since(FIELD_CTIME, mtime)?;
    let crtime = since(FIELD_CRTIME, ctime)?;
    let name_len = usize::try_from(take_varint(b, &mut at)?).ok()?;
    let name_end = at.checked_add(name_len)?;
    let name = std::str::from_utf8(b.get(at..name_end)?).ok()?;
    // Bytes after the name are an inline chunk, whole header at least.
    if b.len() != name_end && b.len() < name_end + INLINE_HEADER_LEN {
        return None;
    }
    let i = Inode {
        ino,
        kind,
        perm,
        uid,
        gid,
        size,
        nlink,
        parent,
        atime,
        mtime,
        ctime,
        crtime,
        name: String::new(),
    };
    Some((i, name, name_end))
}

/// Where a record's inline chunk starts; None for a record without one (or bytes that are no
/// inode record).
fn inline_start(b: &[u8]) -> Option<usize> {
    let (_, name_end) = parse_record(0, b)?;
    (b[0] != INODE_RECORD_VERSION && name_end < b.len()).then_some(name_end)
}

/// LEB128: seven bits a byte, low first, the high bit set on every byte but the last.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `*at`, moving past it; None when cut short or longer than a u64.
fn take_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Chunk 0 of a file as its inode record holds it (see "Inline content").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InlineChunk<'a> {
    /// The content, its checksum verified.
    Content(&'a [u8]),
    /// `redact` erased this version's content: it reads as empty.
    Redacted,
    /// The content does not match its checksum.
    Damaged,
}

const INLINE_REDACTED: u8 = 1;
/// In history's key index only: the content is in the history record this entry indexes.
const INLINE_IN_RECORD: u8 = 2;
/// In a history before-image only: the content is the one the inode held after the record
/// (its operation changed other fields), whose checksum follows; see `keep_form`. Read, no
/// longer written: `delta_form` covers it with the run it adds.
const INLINE_KEPT: u8 = 4;
/// In a history before-image only: the content is a delta against an inode's content after
/// the record, see `delta_form`.
const INLINE_DELTA: u8 = 8;
/// The longest run of delta before-images (`delta_form`) a small file's version is rebuilt
/// through: each link is one index seek and one read of a small record. The image that
/// would make a run longer is kept whole, so every 64th version of a small memory at most
/// is a whole copy.
pub const MAX_IMAGE_RUN: u8 = 64;
const INLINE_HEADER_LEN: usize = 5;

/// The inline chunk of an encoded inode record; None for a record without one (or bytes that
/// are no inode record).
pub fn inline_chunk(record: &[u8]) -> Option<InlineChunk<'_>> {
    inline_chunk_of(inline_part(record)?)
}

/// An inode record decoded with its inline chunk, the record parsed once: what `decode`
/// and `inline_chunk` give for it, the name borrowed from the record (the `Inode`'s own
/// is left empty). None when the bytes are not an inode record.
pub fn decode_with_inline(
    ino: u64,
    record: &[u8],
) -> Option<(Inode, &str, Option<InlineChunk<'_>>)> {
    let (inode, name, name_end) = parse_borrowed(ino, record)?;
    let inline = (record[0] != INODE_RECORD_VERSION && name_end < record.len())
        .then(|| inline_chunk_of(&record[name_end..]))
        .flatten();
    Some((inode, name, inline))
}

/// The inline chunk a record's bytes after its name (`inline_part`) hold.
fn inline_chunk_of(tail: &[u8]) -> Option<InlineChunk<'_>> {
    let (flags, rest) = tail.split_first()?;
    let (sum, data) = rest.split_at_checked(4)?;
    Some(if flags & INLINE_REDACTED != 0 {
        InlineChunk::Redacted
    } else if flags & (INLINE_IN_RECORD | INLINE_KEPT | INLINE_DELTA) == 0
        && crc32c::crc32c(data).to_le_bytes() == sum
    {
        InlineChunk::Content(data)
    } else {
        InlineChunk::Damaged
    })
}

/// The form history's key index keeps of an inode before-image whose inline chunk holds
/// content: its fields and checksum, flagged, without the content, which the record it
/// indexes holds (so a small file's every earlier version is kept once, not twice). None for
/// any other image, which the index keeps whole.
pub fn index_form(record: &[u8]) -> Option<Vec<u8>> {
    let at = inline_start(record)?;
    let part = &record[at..];
    if part[0] != 0 || part.len() == INLINE_HEADER_LEN {
        return None;
    }
    let mut out = record[..at + INLINE_HEADER_LEN].to_vec();
    out[at] = INLINE_IN_RECORD;
    Some(out)
}

/// Whether an index entry's inode image is `index_form`'s: its content is in the record.
pub fn content_in_record(image: &[u8]) -> bool {
    inline_part(image).is_some_and(|p| p[0] & INLINE_IN_RECORD != 0)
}

/// Whether an encoded inode record holds an inline chunk that does not match its checksum
/// (a before-image whose content is kept elsewhere holds none).
pub fn inline_is_damaged(record: &[u8]) -> bool {
    inline_chunk(record) == Some(InlineChunk::Damaged)
        && inline_part(record)
            .is_some_and(|p| p[0] & (INLINE_IN_RECORD | INLINE_KEPT | INLINE_DELTA) == 0)
}

/// The form a history record keeps of before-image `image` when the inode's record after the
/// operation, `after`, holds the same inline chunk: `image` without the content, flagged
/// with its checksum (`INLINE_KEPT`), since the content is the one the inode held after the
/// record. None when the chunks differ or hold no content (the image is kept whole). Earlier
/// builds wrote it; `delta_form` took its place.
#[cfg(test)]
pub fn keep_form(image: &[u8], after: &[u8]) -> Option<Vec<u8>> {
    let at = inline_start(image)?;
    let part = &image[at..];
    if part[0] != 0 || part.len() == INLINE_HEADER_LEN || inline_part(after) != Some(part) {
        return None;
    }
    let mut out = image[..at + INLINE_HEADER_LEN].to_vec();
    out[at] = INLINE_KEPT;
    Some(out)
}

/// Whether before-image `image` holds its content as another version's: `keep_form`'s
/// (the same content) or `delta_form`'s (a delta against it).
pub fn content_kept(image: &[u8]) -> bool {
    inline_part(image).is_some_and(|p| p[0] & (INLINE_KEPT | INLINE_DELTA) != 0)
}

/// The form a history record keeps of before-image `image` (a whole inline chunk) when
/// `base`, the content of inode `base_ino` after the record, is known: the image's fields,
/// then a delta against `base` (flag `INLINE_DELTA`):
///
/// ```text
/// u8      flags (8)
/// u32     CRC-32C of the version's content
/// u8      run: the links of delta images from this one to a whole content, itself
///         included (at most MAX_IMAGE_RUN)
/// varint  base ino: the inode whose content after the record the delta is against (the
///         image's own, or the file's now at its name, which an SDK's rename over gives)
/// varint  bytes taken from the start of the base
/// varint  bytes taken from the end of the base
/// ...     the version's bytes between the two
/// ```
///
/// None when the image holds no whole content, `run` passes `MAX_IMAGE_RUN`, or the delta
/// is not smaller than the content (the image is kept whole).
pub fn delta_form(image: &[u8], base_ino: u64, base: &[u8], run: u8) -> Option<Vec<u8>> {
    let at = inline_start(image)?;
    let part = &image[at..];
    if part[0] != 0 || run == 0 || run > MAX_IMAGE_RUN {
        return None;
    }
    let InlineChunk::Content(data) = inline_chunk(image)? else {
        return None;
    };
    let prefix = data.iter().zip(base).take_while(|(a, b)| a == b).count();
    let room = data.len().min(base.len()) - prefix;
    let suffix = data[prefix..]
        .iter()
        .rev()
        .zip(base[prefix..].iter().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = image[..at].to_vec();
    out.push(INLINE_DELTA);
    out.extend_from_slice(&part[1..INLINE_HEADER_LEN]);
    out.push(run);
    for n in [base_ino, prefix as u64, suffix as u64] {
        put_varint(&mut out, n);
    }
    out.extend_from_slice(&data[prefix..data.len() - suffix]);
    (out.len() < image.len()).then_some(out)
}

/// The fields of a `delta_form` image's inline chunk.
struct DeltaFields<'a> {
    /// The CRC-32C of the version's content.
    sum: [u8; 4],
    run: u8,
    base: u64,
    prefix: usize,
    suffix: usize,
    /// The version's bytes between the base's prefix and suffix.
    middle: &'a [u8],
}

fn delta_fields(part: &[u8]) -> Option<DeltaFields<'_>> {
    if part.first()? & INLINE_DELTA == 0 {
        return None;
    }
    let sum: [u8; 4] = part.get(1..INLINE_HEADER_LEN)?.try_into().ok()?;
    let run = *part.get(INLINE_HEADER_LEN)?;
    let mut at = INLINE_HEADER_LEN + 1;
    let base = take_varint(part, &mut at)?;
    let prefix = usize::try_from(take_varint(part, &mut at)?).ok()?;
    let suffix = usize::try_from(take_varint(part, &mut at)?).ok()?;
    Some(DeltaFields {
        sum,
        run,
        base,
        prefix,
        suffix,
        middle: &part[at..],
    })
}

/// The inode whose content after the record before-image `image` of `ino` is kept against:
/// the base a `delta_form` image names, else `ino` itself.
pub fn kept_base(ino: u64, image: &[u8]) -> u64 {
    inline_part(image)
        .and_then(delta_fields)
        .map_or(ino, |f| f.base)
}

/// The run of delta images ending at this before-image (see `delta_form`): 0 for an image
/// that holds its content whole (or none), its run for a delta, and None for a `keep_form`
/// image, which does not say (a later image is then kept whole).
pub fn image_run(image: &[u8]) -> Option<u8> {
    match inline_part(image) {
        Some(p) if p[0] & INLINE_DELTA != 0 => delta_fields(p).map(|f| f.run),
        Some(p) if p[0] & INLINE_KEPT != 0 => None,
        _ => Some(0),
    }
}

/// A `keep_form` or `delta_form` image whole again, from `later`: the base inode's record
/// at the point after the image's record, whole. A kept image takes its chunk as it is,
/// which must match the kept checksum; a delta is applied to its content and must give the
/// version's checksum. A redacted base gives a redacted image (erasing a version erases
/// the ones kept as it or against it). None when it does not fit.
pub fn with_kept_content(image: &[u8], later: &[u8]) -> Option<Vec<u8>> {
    let at = inline_start(image)?;
    let part = inline_part(later)?;
    let base = match inline_chunk(later)? {
        InlineChunk::Content(data) => data,
        InlineChunk::Redacted => return Some(redact_inline(image)),
        InlineChunk::Damaged => return None,
    };
    if image[at] & INLINE_DELTA == 0 {
        let sum = &image[at + 1..at + INLINE_HEADER_LEN];
        return (crc32c::crc32c(base).to_le_bytes() == sum).then(|| [&image[..at], part].concat());
    }
    let f = delta_fields(&image[at..])?;
    if f.prefix.checked_add(f.suffix)? > base.len() {
        return None;
    }
    let mut data = Vec::with_capacity(f.prefix + f.middle.len() + f.suffix);
    data.extend_from_slice(&base[..f.prefix]);
    data.extend_from_slice(f.middle);
    data.extend_from_slice(&base[base.len() - f.suffix..]);
    (crc32c::crc32c(&data).to_le_bytes() == f.sum)
        .then(|| [&image[..at], &encode_inline(&data)].concat())
}

/// The encoded inline chunk of a record (flags, checksum, content), to carry it into a
/// rewrite of the record's other fields.
pub fn inline_part(record: &[u8]) -> Option<&[u8]> {
    inline_start(record).map(|at| &record[at..])
}

/// An inline chunk as a version-2 or 3 record carries it: flags, the CRC-32C of `data`, `data`.
pub fn encode_inline(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(INLINE_HEADER_LEN + data.len());
    out.push(0);
    out.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The record with its inline chunk's content erased and marked redacted (a record without
/// one is returned unchanged).
pub fn redact_inline(record: &[u8]) -> Vec<u8> {
    match inline_start(record) {
        Some(end) => {
            let mut out = record[..end].to_vec();
            out.push(INLINE_REDACTED);
            out.extend_from_slice(&crc32c::crc32c(&[]).to_le_bytes());
            out
        }
        None => record.to_vec(),
    }
}

/// The value a key had before a transaction changed it: undoing a record restores these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undo {
    Inode {
        ino: u64,
        old: Option<Vec<u8>>,
    },
    Dirent {
        parent: u64,
        name: String,
        old: Option<(u64, u8)>,
    },
    Filemap {
        ino: u64,
        idx: u64,
        old: Option<u64>,
    },
    Orphan {
        ino: u64,
        present: bool,
    },
    /// Every inode numbered `from..to` was handed out by the operation, and everything keyed
    /// by one of them (its inode record, its chunks, its orphan mark, the entries of a
    /// directory among them) was created by it: undone by removing all of that, children
    /// before parents. Stands for those keys' entries, which the record leaves out (see
    /// `history::compact_created`); the entries naming them from outside stay.
    Created {
        from: u64,
        to: u64,
    },
}

/// One committed operation: what it was, who did it, and how to undo it.
///
/// Layout, version 1 (little-endian; `str` is a u16 length and UTF-8 bytes):
///
/// ```text
/// u8 version (1) | i64 time | str op | u16 n, n x str paths | u64 ino | u64 size_before |
/// u64 size_after | u32 uid | u32 gid | u32 pid | str comm | u8 flags (1: content redacted) |
/// u32 n, n x undo | [u8 1, str conflict]
/// undo: u8 tag, then
///   1 inode:   u64 ino, u8 has, [u32 len, bytes]
///   2 dirent:  u64 parent, str name, u8 has, [u64 ino, u8 kind]
///   3 filemap: u64 ino, u64 idx, u8 has, [u64 blob]
///   4 orphan:  u64 ino, u8 present
///   9 created: var from, var to (in both forms; see version 3 for `var`)
/// ```
///
/// The trailing conflict note (a replace that overwrote or was refused for overwriting
/// another process's edit) was added within version 1: records without it end after the
/// undo list, and readers that predate it ignore it.
///
/// Version 2 (format 6) is the same header with `u32 n, u32 parts` in place of the undo
/// list: its n entries are in `history_undo`, encoded as above one after another, cut
/// between entries into `parts` values of at most `UNDO_PART_BYTES` (an entry is never
/// split; one larger than the bound, which the inline limit rules out, would fill a part
/// alone). A record without entries has no parts.
///
/// Version 3 (format 6, still; `var` is a LEB128 varint, `vstr` a varint length and UTF-8
/// bytes):
///
/// ```text
/// u8 version (3) | i64 time | vstr op | var n, n x vstr paths | var ino | var size_before |
/// var size_after | var uid | var gid | var pid | vstr comm |
/// u8 flags (1 redacted, 2 folded, 4 conflict, 8 inline) | var n undo entries |
/// [var parts, unless inline] | [var m, m x vstr folded ops, if folded] |
/// [vstr conflict, if conflict] | [n x undo as above, if inline]
/// ```
///
/// Its entries, inline or in parts, are written with varints, under tags of their own
/// (an old entry's tag, plus 4), beside which entries of the older form still read:
///
/// ```text
///   5 inode:   var ino, var n (0: none; else n - 1 bytes follow)
///   6 dirent:  var parent, vstr name, u8 has, [var ino, u8 kind]
///   7 filemap: var ino, var idx, u8 has, [var blob]
///   8 orphan:  var ino, u8 present
///   9 created: var from, var to (as in the older form)
/// ```
///
/// History's key index keeps the older form (`Undo::encode`).
///
/// An inline record holds its entries itself (no `history_undo` row): every record whose
/// entries take at most `RECORD_INLINE_BYTES`. A folded record is a rename that also undoes
/// the create and writes of its source the same process made just before (`folded` names
/// them, oldest first; see `history::WriteTxn::foldable`): it keeps each key's first
/// before-image only, and its source's first entry says the source did not exist. A create
/// may fold the first write of its file the same way (`folded` is `["write"]`; see
/// `history::WriteTxn::fold_into_create`): its record, updated in place, keeps its seq and
/// time.
///
/// As JSON (the control socket's `log` pages) it carries every field but the undo entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HistoryRecord {
    pub seq: u64,
    pub time: i64,
    pub op: String,
    pub paths: Vec<String>,
    pub ino: u64,
    pub size_before: u64,
    pub size_after: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub comm: String,
    pub redacted: bool,
    #[serde(skip)]
    pub undo: Vec<Undo>,
    /// Set when this replace lost, or was refused for losing, another process's edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// As decoded: how many undo entries the record has, whether or not `undo` holds them.
    #[serde(skip)]
    pub undo_len: u64,
    /// As decoded: `Some(n)` for a version-2 record, whose entries are in `history_undo`
    /// parts 0..n; None for a version-1 record, whose entries are in its own value.
    #[serde(skip)]
    pub undo_parts: Option<u32>,
    /// The operations of the earlier records folded into this one (a rename of a file the
    /// same process had just created and written: "create", then "write"...; a create that
    /// took in its file's first write: "write"); empty for any other record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folded: Vec<String>,
}

/// The version of a record whose undo list is in its own value (format 5).
const HISTORY_RECORD_WHOLE: u8 = 1;
/// The version of a record whose undo entries are in `history_undo` parts (format 6).
const HISTORY_RECORD_SPLIT: u8 = 2;
/// Version 2 written compactly (varints), with the operations folded into it.
const HISTORY_RECORD_COMPACT: u8 = 3;
/// Header flags: the content of some before-image was redacted; operations were folded in.
const RECORD_REDACTED: u8 = 1;
const RECORD_FOLDED: u8 = 2;
const RECORD_CONFLICT: u8 = 4;
const RECORD_INLINE: u8 = 8;
/// A record whose encoded entries take at most this many bytes keeps them in its own value
/// (version 3, inline): no `history_undo` row for an ordinary edit's few entries, whose
/// before-image of a memory holds at most `INLINE_MAX` bytes of content.
pub const RECORD_INLINE_BYTES: usize = 4096 - 256;

/// The most bytes of undo entries one `history_undo` value holds: below 64 KiB with room
/// for a leaf's header (see `CHUNK_SIZE`), so a part fills one page at most.
pub const UNDO_PART_BYTES: usize = 64 * 1024 - 256;

impl Undo {
    fn encode_into(&self, e: &mut Enc) {
        match self {
            Undo::Inode { ino, old } => {
                e.u8(1);
                e.u64(*ino);
                e.u8(u8::from(old.is_some()));
                if let Some(b) = old {
                    e.u32(b.len() as u32);
                    e.0.extend_from_slice(b);
                }
            }
            Undo::Dirent { parent, name, old } => {
                e.u8(2);
                e.u64(*parent);
                e.str(name);
                e.u8(u8::from(old.is_some()));
                if let Some((ino, kind)) = old {
                    e.u64(*ino);
                    e.u8(*kind);
                }
            }
            Undo::Filemap { ino, idx, old } => {
                e.u8(3);
                e.u64(*ino);
                e.u64(*idx);
                e.u8(u8::from(old.is_some()));
                if let Some(b) = old {
                    e.u64(*b);
                }
            }
            Undo::Orphan { ino, present } => {
                e.u8(4);
                e.u64(*ino);
                e.u8(u8::from(*present));
            }
            Undo::Created { from, to } => Undo::encode_created(e, *from, *to),
        }
    }

    /// A `Created` entry has one form in both encodings (tag 9, varints): it came after both.
    fn encode_created(e: &mut Enc, from: u64, to: u64) {
        e.u8(9);
        e.var(from);
        e.var(to);
    }

    /// The entry with varints (tags 5 to 9), as version-3 records and their parts hold it.
    fn encode_compact_into(&self, e: &mut Enc) {
        match self {
            Undo::Inode { ino, old } => {
                e.u8(5);
                e.var(*ino);
                match old {
                    None => e.var(0),
                    Some(b) => {
                        e.var(b.len() as u64 + 1);
                        e.0.extend_from_slice(b);
                    }
                }
            }
            Undo::Dirent { parent, name, old } => {
                e.u8(6);
                e.var(*parent);
                e.vstr(name);
                match old {
                    None => e.u8(0),
                    Some((ino, kind)) => {
                        e.u8(1);
                        e.var(*ino);
                        e.u8(*kind);
                    }
                }
            }
            Undo::Filemap { ino, idx, old } => {
                e.u8(7);
                e.var(*ino);
                e.var(*idx);
                e.u8(u8::from(old.is_some()));
                if let Some(b) = old {
                    e.var(*b);
                }
            }
            Undo::Orphan { ino, present } => {
                e.u8(8);
                e.var(*ino);
                e.u8(u8::from(*present));
            }
            Undo::Created { from, to } => Undo::encode_created(e, *from, *to),
        }
    }

    fn decode_from(d: &mut Dec<'_>) -> Option<Undo> {
        Some(match d.u8()? {
            5 => {
                let ino = d.var()?;
                let old = match usize::try_from(d.var()?).ok()? {
                    0 => None,
                    n => Some(d.take(n - 1)?.to_vec()),
                };
                Undo::Inode { ino, old }
            }
            6 => {
                let parent = d.var()?;
                let name = d.vstr()?;
                let old = match d.u8()? {
                    0 => None,
                    1 => Some((d.var()?, d.u8()?)),
                    _ => return None,
                };
                Undo::Dirent { parent, name, old }
            }
            7 => {
                let ino = d.var()?;
                let idx = d.var()?;
                let old = match d.u8()? {
                    0 => None,
                    1 => Some(d.var()?),
                    _ => return None,
                };
                Undo::Filemap { ino, idx, old }
            }
            8 => Undo::Orphan {
                ino: d.var()?,
                present: d.u8()? != 0,
            },
            1 => {
                let ino = d.u64()?;
                let old = if d.u8()? != 0 {
                    let len = d.u32()? as usize;
                    Some(d.take(len)?.to_vec())
                } else {
                    None
                };
                Undo::Inode { ino, old }
            }
            2 => {
                let parent = d.u64()?;
                let name = d.str()?;
                let old = if d.u8()? != 0 {
                    Some((d.u64()?, d.u8()?))
                } else {
                    None
                };
                Undo::Dirent { parent, name, old }
            }
            3 => {
                let ino = d.u64()?;
                let idx = d.u64()?;
                let old = if d.u8()? != 0 { Some(d.u64()?) } else { None };
                Undo::Filemap { ino, idx, old }
            }
            4 => Undo::Orphan {
                ino: d.u64()?,
                present: d.u8()? != 0,
            },
            9 => Undo::Created {
                from: d.var()?,
                to: d.var()?,
            },
            _ => return None,
        })
    }

    /// Steps over one encoded entry.
    fn skip(d: &mut Dec<'_>) -> Option<()> {
        if matches!(d.0.first(), Some(5..=9)) {
            return Undo::decode_from(d).map(|_| ());
        }
        match d.u8()? {
            1 => {
                d.take(8)?;
                if d.u8()? != 0 {
                    let len = d.u32()? as usize;
                    d.take(len)?;
                }
            }
            2 => {
                d.take(8)?;
                let n = d.u16()? as usize;
                d.take(n)?;
                if d.u8()? != 0 {
                    d.take(9)?;
                }
            }
            3 => {
                d.take(16)?;
                if d.u8()? != 0 {
                    d.take(8)?;
                }
            }
            4 => {
                d.take(9)?;
            }
            _ => return None,
        }
        Some(())
    }

    /// One entry as the record stores it (the value of a `history_keys` row).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(32));
        self.encode_into(&mut e);
        e.0
    }

    /// Decodes what `encode` wrote; None when it does not decode whole.
    pub fn decode(b: &[u8]) -> Option<Undo> {
        let mut d = Dec(b);
        let u = Undo::decode_from(&mut d)?;
        d.0.is_empty().then_some(u)
    }

    /// The key this entry restores, as `history_keys` orders it (see the module comment).
    pub fn key(&self) -> Vec<u8> {
        match self {
            Undo::Inode { ino, .. } => undo_key(1, &[*ino], ""),
            Undo::Dirent { parent, name, .. } => undo_key(2, &[*parent], name),
            Undo::Filemap { ino, idx, .. } => undo_key(3, &[*ino, *idx], ""),
            Undo::Orphan { ino, .. } => undo_key(4, &[*ino], ""),
            // Never indexed: it names no key of its own (see `history::index_entries`).
            Undo::Created { from, to } => undo_key(9, &[*from, *to], ""),
        }
    }
}

/// A `history_keys` key: the table tag, big-endian numbers, then a name.
/// The tag of a path row in `history_keys` (format 9): above every undo key's tag, so the
/// rows of one index are one range of the table, each in the order the index had as a
/// table of its own.
pub(crate) const PATH_INDEX_TAG: u8 = 0x10;
/// The tag of a time row in `history_keys` (format 9).
pub(crate) const TIME_INDEX_TAG: u8 = 0x11;

/// The `history_keys` key of path `p` in history's path index: its tag, then the path's
/// bytes. Bytes compare as the strings do, and a path holds no NUL, so `(key, seq)` orders
/// as `(path, seq)` did in `history_paths`.
pub(crate) fn path_index_key(p: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + p.len());
    k.push(PATH_INDEX_TAG);
    k.extend_from_slice(p.as_bytes());
    k
}

/// The `history_keys` key of time `t` (ns since the epoch) in history's time index: its
/// tag, then the time with its sign bit flipped, big-endian, so keys order as times do.
pub(crate) fn time_index_key(t: i64) -> [u8; 9] {
    let mut k = [TIME_INDEX_TAG; 9];
    k[1..].copy_from_slice(&((t as u64) ^ (1 << 63)).to_be_bytes());
    k
}

/// The time a `time_index_key` holds; None for any other key.
pub(crate) fn time_of_index_key(k: &[u8]) -> Option<i64> {
    match k {
        [TIME_INDEX_TAG, rest @ ..] => {
            let b: [u8; 8] = rest.try_into().ok()?;
            Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
        }
        _ => None,
    }
}

pub(crate) fn undo_key(tag: u8, nums: &[u64], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + 8 * nums.len() + name.len());
    k.push(tag);
    for n in nums {
        k.extend_from_slice(&n.to_be_bytes());
    }
    k.extend_from_slice(name.as_bytes());
    k
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        // Longer strings are cut at a character boundary; paths are bounded far below this.
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.0.extend_from_slice(&s.as_bytes()[..end]);
    }
    fn var(&mut self, v: u64) {
        put_varint(&mut self.0, v);
    }
    /// A string as a varint length and its bytes.
    fn vstr(&mut self, s: &str) {
        self.var(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn var(&mut self) -> Option<u64> {
        let mut at = 0;
        let v = take_varint(self.0, &mut at)?;
        self.0 = &self.0[at..];
        Some(v)
    }
    fn vstr(&mut self) -> Option<String> {
        let n = usize::try_from(self.var()?).ok()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

impl HistoryRecord {
    fn encode_header(&self, e: &mut Enc, version: u8) {
        e.u8(version);
        e.u64(self.time as u64);
        e.str(&self.op);
        e.u16(self.paths.len() as u16);
        for p in &self.paths {
            e.str(p);
        }
        e.u64(self.ino);
        e.u64(self.size_before);
        e.u64(self.size_after);
        e.u32(self.uid);
        e.u32(self.gid);
        e.u32(self.pid);
        e.str(&self.comm);
        e.u8(u8::from(self.redacted));
    }

    fn encode_conflict(&self, e: &mut Enc) {
        if let Some(c) = &self.conflict {
            e.u8(1);
            e.str(c);
        }
    }

    /// The header of this record, whose `undo_len` entries make `parts` parts: version 3
    /// (version 2's fields, compactly, and the operations folded into it).
    pub fn encode_header_v2(&self, undo_len: u64, parts: u32) -> Vec<u8> {
        self.encode_compact(undo_len, Some(parts), &[])
    }

    /// This record whole, its entries (`self.undo`) in its own value: version 3, for a
    /// record whose entries take at most `RECORD_INLINE_BYTES`.
    pub fn encode_inline(&self) -> Vec<u8> {
        self.encode_compact(self.undo.len() as u64, None, &self.undo)
    }

    /// Version 3: its entries in `parts` parts, or when None, `entries` after the header.
    fn encode_compact(&self, undo_len: u64, parts: Option<u32>, entries: &[Undo]) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(64));
        e.u8(HISTORY_RECORD_COMPACT);
        e.u64(self.time as u64);
        e.vstr(&self.op);
        e.var(self.paths.len() as u64);
        for p in &self.paths {
            e.vstr(p);
        }
        for v in [self.ino, self.size_before, self.size_after] {
            e.var(v);
        }
        for v in [self.uid, self.gid, self.pid] {
            e.var(u64::from(v));
        }
        e.vstr(&self.comm);
        let mut flags = 0;
        if self.redacted {
            flags |= RECORD_REDACTED;
        }
        if !self.folded.is_empty() {
            flags |= RECORD_FOLDED;
        }
        if self.conflict.is_some() {
            flags |= RECORD_CONFLICT;
        }
        if parts.is_none() {
            flags |= RECORD_INLINE;
        }
        e.u8(flags);
        e.var(undo_len);
        if let Some(n) = parts {
            e.var(u64::from(n));
        }
        if !self.folded.is_empty() {
            e.var(self.folded.len() as u64);
            for op in &self.folded {
                e.vstr(op);
            }
        }
        if let Some(c) = &self.conflict {
            e.vstr(c);
        }
        for u in entries {
            u.encode_compact_into(&mut e);
        }
        e.0
    }

    /// The version-2 header (format 6 before version 3): what earlier builds wrote.
    pub fn encode_header_split(&self, undo_len: u64, parts: u32) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(128));
        self.encode_header(&mut e, HISTORY_RECORD_SPLIT);
        e.u32(undo_len as u32);
        e.u32(parts);
        self.encode_conflict(&mut e);
        e.0
    }

    /// The whole version-1 encoding (format 5), undo list included: what older builds wrote.
    pub fn encode_whole(&self) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(128));
        self.encode_header(&mut e, HISTORY_RECORD_WHOLE);
        e.u32(self.undo.len() as u32);
        for u in &self.undo {
            u.encode_into(&mut e);
        }
        self.encode_conflict(&mut e);
        e.0
    }

    /// The commit time of an encoded record, without decoding the rest.
    pub fn time_of(b: &[u8]) -> Option<i64> {
        let mut d = Dec(b);
        if !matches!(
            d.u8()?,
            HISTORY_RECORD_WHOLE | HISTORY_RECORD_SPLIT | HISTORY_RECORD_COMPACT
        ) {
            return None;
        }
        Some(d.u64()? as i64)
    }

    /// Decodes a record without its undo entries (what `log` shows): a version-1 record's
    /// entries are stepped over, not kept, so a large record costs no allocation per entry.
    pub fn decode_summary(seq: u64, b: &[u8]) -> Option<HistoryRecord> {
        Self::decode_with(seq, b, false)
    }

    /// Decodes a record: a version-1 record with its undo entries, a version-2 record's
    /// header (its entries are in `history_undo`, `undo_parts` says how many parts); None
    /// when the bytes are neither.
    pub fn decode(seq: u64, b: &[u8]) -> Option<HistoryRecord> {
        Self::decode_with(seq, b, true)
    }

    fn decode_with(seq: u64, b: &[u8], undo: bool) -> Option<HistoryRecord> {
        let mut d = Dec(b);
        let version = d.u8()?;
        if version == HISTORY_RECORD_COMPACT {
            return Self::decode_compact(seq, d, undo);
        }
        if !matches!(version, HISTORY_RECORD_WHOLE | HISTORY_RECORD_SPLIT) {
            return None;
        }
        let time = d.u64()? as i64;
        let op = d.str()?;
        let n = d.u16()?;
        let paths = (0..n).map(|_| d.str()).collect::<Option<Vec<_>>>()?;
        let mut r = HistoryRecord {
            seq,
            time,
            op,
            paths,
            ino: d.u64()?,
            size_before: d.u64()?,
            size_after: d.u64()?,
            uid: d.u32()?,
            gid: d.u32()?,
            pid: d.u32()?,
            comm: d.str()?,
            redacted: d.u8()? != 0,
            undo: Vec::new(),
            conflict: None,
            undo_len: 0,
            undo_parts: None,
            folded: Vec::new(),
        };
        let n = d.u32()?;
        r.undo_len = u64::from(n);
        if version == HISTORY_RECORD_SPLIT {
            r.undo_parts = Some(d.u32()?);
        } else {
            for _ in 0..n {
                if undo {
                    r.undo.push(Undo::decode_from(&mut d)?);
                } else {
                    Undo::skip(&mut d)?;
                }
            }
        }
        if d.u8() == Some(1) {
            r.conflict = Some(d.str()?);
        }
        Some(r)
    }
}

impl HistoryRecord {
    /// A version-3 record, after its version byte: its entries decoded when `undo` and
    /// they are inline, else stepped over.
    fn decode_compact(seq: u64, mut d: Dec<'_>, undo: bool) -> Option<HistoryRecord> {
        let time = d.u64()? as i64;
        let op = d.vstr()?;
        let n = d.var()?;
        let mut paths = Vec::new();
        for _ in 0..n {
            paths.push(d.vstr()?);
        }
        let ino = d.var()?;
        let size_before = d.var()?;
        let size_after = d.var()?;
        let mut id = || u32::try_from(d.var()?).ok();
        let (uid, gid, pid) = (id()?, id()?, id()?);
        let comm = d.vstr()?;
        let flags = d.u8()?;
        if flags & !(RECORD_REDACTED | RECORD_FOLDED | RECORD_CONFLICT | RECORD_INLINE) != 0 {
            return None;
        }
        let undo_len = d.var()?;
        let undo_parts = match flags & RECORD_INLINE {
            0 => Some(u32::try_from(d.var()?).ok()?),
            _ => None,
        };
        let mut folded = Vec::new();
        if flags & RECORD_FOLDED != 0 {
            let n = d.var()?;
            for _ in 0..n {
                folded.push(d.vstr()?);
            }
        }
        let conflict = match flags & RECORD_CONFLICT {
            0 => None,
            _ => Some(d.vstr()?),
        };
        let mut entries = Vec::new();
        if undo_parts.is_none() {
            for _ in 0..undo_len {
                if undo {
                    entries.push(Undo::decode_from(&mut d)?);
                } else {
                    Undo::skip(&mut d)?;
                }
            }
        }
        d.0.is_empty().then_some(HistoryRecord {
            seq,
            time,
            op,
            paths,
            ino,
            size_before,
            size_after,
            uid,
            gid,
            pid,
            comm,
            redacted: flags & RECORD_REDACTED != 0,
            undo: entries,
            conflict,
            undo_len,
            undo_parts,
            folded,
        })
    }
}

/// Cuts encoded undo entries into `history_undo` parts of at most `UNDO_PART_BYTES`, between
/// entries, handing each full part to `put` as it fills: the encoding never holds more than
/// one part.
pub(crate) fn undo_parts<E>(
    undo: &[Undo],
    mut put: impl FnMut(u32, &[u8]) -> Result<(), E>,
) -> Result<u32, E> {
    let mut part = Enc(Vec::with_capacity(
        UNDO_PART_BYTES.min(64 * undo.len().max(1)),
    ));
    let mut n = 0u32;
    for u in undo {
        let at = part.0.len();
        u.encode_compact_into(&mut part);
        if part.0.len() > UNDO_PART_BYTES && at > 0 {
            let tail = part.0.split_off(at);
            put(n, &part.0)?;
            n += 1;
            part.0 = tail;
        }
    }
    if !part.0.is_empty() {
        put(n, &part.0)?;
        n += 1;
    }
    Ok(n)
}

/// Decodes one `history_undo` part: its entries, in order; None when it does not decode
/// whole.
pub fn decode_undo_part(b: &[u8]) -> Option<Vec<Undo>> {
    let mut d = Dec(b);
    let mut out = Vec::new();
    while !d.0.is_empty() {
        out.push(Undo::decode_from(&mut d)?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_record_round_trips() {
        let r = HistoryRecord {
            seq: 9,
            time: 1_700_000_000_000_000_000,
            op: "rename".into(),
            paths: vec!["/memories/a".into(), "/memories/b \u{1F600}".into()],
            ino: 5,
            size_before: 10,
            size_after: 12,
            uid: 1000,
            gid: 100,
            pid: 4242,
            comm: "node".into(),
            redacted: false,
            conflict: Some("pid 1 replaced content pid 2 wrote".into()),
            folded: Vec::new(),
            undo_len: 0,
            undo_parts: None,
            undo: vec![
                Undo::Inode {
                    ino: 5,
                    old: Some(vec![1, 2, 3]),
                },
                Undo::Inode { ino: 6, old: None },
                Undo::Dirent {
                    parent: 1,
                    name: "a".into(),
                    old: Some((5, 1)),
                },
                Undo::Dirent {
                    parent: 1,
                    name: "b".into(),
                    old: None,
                },
                Undo::Filemap {
                    ino: 5,
                    idx: 0,
                    old: Some(77),
                },
                Undo::Filemap {
                    ino: 5,
                    idx: 1,
                    old: None,
                },
                Undo::Orphan {
                    ino: 6,
                    present: true,
                },
            ],
        };
        let whole = HistoryRecord {
            undo_len: r.undo.len() as u64,
            ..r.clone()
        };
        assert_eq!(HistoryRecord::decode(9, &r.encode_whole()), Some(whole));
        let summary = HistoryRecord {
            undo: Vec::new(),
            undo_len: r.undo.len() as u64,
            ..r.clone()
        };
        assert_eq!(
            HistoryRecord::decode_summary(9, &r.encode_whole()),
            Some(summary.clone())
        );
        assert_eq!(HistoryRecord::time_of(&r.encode_whole()), Some(r.time));
        for u in &r.undo {
            assert_eq!(Undo::decode(&u.encode()).as_ref(), Some(u));
        }
        // Version 2: the header, and the entries in parts.
        let mut parts = Vec::new();
        let n = undo_parts::<()>(&r.undo, |i, b| {
            assert_eq!(i as usize, parts.len());
            parts.push(b.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 1);
        let header = r.encode_header_v2(r.undo.len() as u64, n);
        let split = HistoryRecord {
            undo_parts: Some(1),
            ..summary
        };
        assert_eq!(HistoryRecord::decode(9, &header), Some(split.clone()));
        assert_eq!(
            HistoryRecord::decode_summary(9, &header),
            Some(split.clone())
        );
        assert_eq!(HistoryRecord::time_of(&header), Some(r.time));
        assert_eq!(decode_undo_part(&parts[0]), Some(r.undo.clone()));
        assert_eq!(decode_undo_part(&parts[0][..parts[0].len() - 1]), None);
        // What version 2 wrote still reads.
        let old = r.encode_header_split(r.undo.len() as u64, n);
        assert_eq!(HistoryRecord::decode(9, &old), Some(split.clone()));
        // Version 3 inline: the entries in the value, stepped over for a summary; with and
        // without a conflict note and folded operations.
        for (conflict, folded) in [
            (r.conflict.clone(), vec![]),
            (None, vec!["create".into(), "write".into()]),
        ] {
            let r = HistoryRecord {
                conflict,
                folded,
                ..r.clone()
            };
            let inline = r.encode_inline();
            assert!(
                inline.len() < old.len() + parts[0].len(),
                "{}",
                inline.len()
            );
            let whole = HistoryRecord {
                undo_len: r.undo.len() as u64,
                ..r.clone()
            };
            assert_eq!(HistoryRecord::decode(9, &inline), Some(whole.clone()));
            let summary = HistoryRecord {
                undo: Vec::new(),
                ..whole
            };
            assert_eq!(HistoryRecord::decode_summary(9, &inline), Some(summary));
            assert_eq!(HistoryRecord::time_of(&inline), Some(r.time));
            for cut in 1..inline.len() {
                assert_eq!(
                    HistoryRecord::decode(9, &inline[..cut]),
                    None,
                    "cut at {cut}"
                );
            }
            let header = r.encode_header_v2(r.undo.len() as u64, 3);
            let split = HistoryRecord {
                undo_len: r.undo.len() as u64,
                undo_parts: Some(3),
                undo: Vec::new(),
                ..r.clone()
            };
            assert_eq!(HistoryRecord::decode(9, &header), Some(split));
        }
        let mut bad = r.encode_whole();
        bad[0] = 4;
        assert_eq!(HistoryRecord::decode(9, &bad), None);
        assert_eq!(HistoryRecord::decode(9, &r.encode_whole()[..20]), None);
    }

    /// The compact form of every entry reads back, beside the older form in one part, and
    /// takes fewer bytes; cut short, it does not decode.
    #[test]
    fn compact_undo_entries_round_trip_beside_old_ones() {
        let entries = vec![
            Undo::Inode { ino: 7, old: None },
            Undo::Inode {
                ino: u64::MAX,
                old: Some(vec![2; 300]),
            },
            Undo::Dirent {
                parent: 1,
                name: "mem.md".into(),
                old: Some((u64::MAX, 1)),
            },
            Undo::Dirent {
                parent: 300,
                name: ".tmp-1-x".into(),
                old: None,
            },
            Undo::Filemap {
                ino: 5,
                idx: 70_000,
                old: Some(u64::MAX),
            },
            Undo::Filemap {
                ino: 5,
                idx: 0,
                old: None,
            },
            Undo::Orphan {
                ino: 9,
                present: true,
            },
        ];
        let mut mixed = Enc(Vec::new());
        for u in &entries {
            let mut c = Enc(Vec::new());
            u.encode_compact_into(&mut c);
            assert!(c.0.len() < u.encode().len(), "{u:?}");
            assert_eq!(decode_undo_part(&c.0), Some(vec![u.clone()]));
            for cut in 0..c.0.len() {
                assert_eq!(
                    decode_undo_part(&c.0[..cut]).filter(|v| !v.is_empty()),
                    None
                );
            }
            u.encode_compact_into(&mut mixed);
            u.encode_into(&mut mixed);
        }
        let both: Vec<Undo> = entries
            .iter()
            .flat_map(|u| [u.clone(), u.clone()])
            .collect();
        assert_eq!(decode_undo_part(&mixed.0), Some(both));

        // A `Created` entry has one form in both encodings, under a tag no other entry uses.
        let created = Undo::Created {
            from: 3,
            to: u64::MAX,
        };
        let mut c = Enc(Vec::new());
        created.encode_compact_into(&mut c);
        assert_eq!(c.0, created.encode());
        assert_eq!(Undo::decode(&c.0), Some(created.clone()));
        entries[0].encode_compact_into(&mut c);
        entries[0].encode_into(&mut c);
        assert_eq!(
            decode_undo_part(&c.0),
            Some(vec![created, entries[0].clone(), entries[0].clone()])
        );
    }

    /// Parts are cut between entries, each at most `UNDO_PART_BYTES`, and give back the
    /// entries in order.
    #[test]
    fn undo_parts_are_bounded_and_in_order() {
        let undo: Vec<Undo> = (0..20_000)
            .map(|i| Undo::Dirent {
                parent: i,
                name: format!("file-{i}.md"),
                old: (i % 3 == 0).then_some((i + 7, 1)),
            })
            .collect();
        let mut parts = Vec::new();
        let n = undo_parts::<()>(&undo, |_, b| {
            parts.push(b.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(n as usize, parts.len());
        assert!(n > 3, "{n}");
        assert!(parts.iter().all(|p| p.len() <= UNDO_PART_BYTES));
        let back: Vec<Undo> = parts
            .iter()
            .flat_map(|p| decode_undo_part(p).unwrap())
            .collect();
        assert_eq!(back, undo);
        assert_eq!(undo_parts::<()>(&[], |_, _| panic!()).unwrap(), 0);
    }

    fn sample() -> Inode {
        Inode {
            ino: 42,
            kind: Kind::File,
            perm: 0o600,
            uid: 1000,
            gid: 100,
            size: 123_456_789,
            nlink: 1,
            parent: 7,
            atime: -5,
            mtime: 1_700_000_000_123_456_789,
            ctime: 1_700_000_000_000_000_001,
            crtime: 3,
            name: "notes \u{1F600}.md".to_string(),
        }
    }

    #[test]
    fn a_delta_image_rebuilds_its_version_from_its_base_and_nothing_else() {
        let i = sample();
        let text = |v: u8| -> Vec<u8> {
            (0..1500)
                .map(|n| b'a' + ((n + v as usize) % 26) as u8)
                .collect()
        };
        let old = text(0);
        let mut new = old.clone();
        new[700..708].copy_from_slice(b"CHANGED!");
        let image = i.encode_with(Some(&encode_inline(&old)));
        let later = i.encode_with(Some(&encode_inline(&new)));
        let d = delta_form(&image, 42, &new, 3).unwrap();
        assert!(d.len() < i.encode().len() + 30, "{} bytes", d.len());
        assert!(content_kept(&d));
        assert_eq!(kept_base(7, &d), 42);
        assert_eq!(image_run(&d), Some(3));
        assert_eq!(image_run(&image), Some(0));
        assert_eq!(inline_chunk(&d), Some(InlineChunk::Damaged));
        assert!(!inline_is_damaged(&d));
        assert_eq!(with_kept_content(&d, &later), Some(image.clone()));
        // Another base, a redacted one, a run past the cap, a delta not smaller.
        let other = i.encode_with(Some(&encode_inline(&text(1))));
        assert_eq!(with_kept_content(&d, &other), None);
        assert_eq!(
            with_kept_content(&d, &redact_inline(&later)),
            Some(redact_inline(&image))
        );
        assert_eq!(delta_form(&image, 42, &new, MAX_IMAGE_RUN + 1), None);
        assert_eq!(delta_form(&image, 42, &new, 0), None);
        assert_eq!(delta_form(&image, 42, b"", 1), None);
        // The same content: an empty delta.
        let same = delta_form(&image, 7, &old, 1).unwrap();
        assert_eq!(with_kept_content(&same, &image), Some(image.clone()));
        // A flipped bit in the checksum, the lengths or the bytes is caught (the flags'
        // unused bits, the run and the base ino do not take part in rebuilding).
        let start = i.encode().len();
        for at in (start + 1..start + 5).chain(start + 7..d.len()) {
            let mut bad = d.clone();
            bad[at] ^= 0x10;
            assert_ne!(
                with_kept_content(&bad, &later),
                Some(image.clone()),
                "byte {at}"
            );
        }
    }

    #[test]
    fn an_image_kept_by_an_earlier_build_still_reads() {
        let i = sample();
        let data = b"the same content".to_vec();
        let image = i.encode_with(Some(&encode_inline(&data)));
        let kept = keep_form(&image, &image).unwrap();
        assert!(content_kept(&kept));
        assert_eq!(image_run(&kept), None);
        assert_eq!(kept_base(9, &kept), 9);
        assert_eq!(with_kept_content(&kept, &image), Some(image.clone()));
        let other = i.encode_with(Some(&encode_inline(b"other content")));
        assert_eq!(with_kept_content(&kept, &other), None);
    }

    #[test]
    fn inode_round_trips() {
        let i = sample();
        assert_eq!(Inode::decode(42, &i.encode()), Some(i));
    }

    #[test]
    fn inode_layout_is_little_endian_and_versioned() {
        let i = sample();
        let b = i.encode();
        assert_eq!(b[0], 3);
        // A file (no flag 1) whose perm, gid, atime, ctime and crtime are given, nlink not.
        assert_eq!(b[1], 2 | 4 | 16 | 32 | 64);
        // perm 0o600 = 384: two varint bytes; uid 1000: two; gid 100: one.
        assert_eq!(&b[2..4], &[0x80, 0x03]);
        assert_eq!(&b[4..6], &[0xe8, 0x07]);
        assert_eq!(b[6], 100);
        let name = "notes \u{1F600}.md";
        assert!(b.ends_with(name.as_bytes()));
        assert!(b.len() < 68 + name.len() - 20, "{} bytes", b.len());
        // Version 2 held the nlink the flags leave out.
        assert_eq!(i.encode_version_2(None).len(), b.len() + 1);
    }

    /// An inode of `kind` whose fields named in `given` (version 3's flags) are off their
    /// usual values, the others at them.
    fn with_fields(kind: Kind, given: u8) -> Inode {
        let on = |f: u8| given & f != 0;
        let mtime = 1_700_000_000_123_456_789;
        let ctime = if on(FIELD_CTIME) { mtime + 5 } else { mtime };
        Inode {
            ino: 9,
            kind,
            perm: match (on(FIELD_PERM), kind) {
                (false, Kind::File) => 0o644,
                (false, Kind::Dir) => 0o755,
                // The other kind's usual mode is no usual value of this one.
                (true, Kind::File) => 0o755,
                (true, Kind::Dir) => 0o644,
            },
            uid: 1000,
            gid: if on(FIELD_GID) { 1001 } else { 1000 },
            size: if kind == Kind::File { 100 } else { 0 },
            nlink: match (on(FIELD_NLINK), kind) {
                (false, Kind::File) => 1,
                (false, Kind::Dir) => 2,
                (true, Kind::File) => 0,
                (true, Kind::Dir) => 3,
            },
            parent: 7,
            atime: if on(FIELD_ATIME) { mtime - 1 } else { mtime },
            mtime,
            ctime,
            crtime: if on(FIELD_CRTIME) { ctime - 9 } else { ctime },
            name: "f.md".into(),
        }
    }

    #[test]
    fn every_combination_of_left_out_fields_round_trips() {
        let optional = [
            FIELD_PERM,
            FIELD_GID,
            FIELD_NLINK,
            FIELD_ATIME,
            FIELD_CTIME,
            FIELD_CRTIME,
        ];
        let data = b"a small memory".to_vec();
        for kind in [Kind::File, Kind::Dir] {
            for mask in 0..1u8 << optional.len() {
                let given: u8 = optional
                    .iter()
                    .enumerate()
                    .filter(|&(n, _)| mask & (1 << n) != 0)
                    .map(|(_, f)| f)
                    .sum();
                let i = with_fields(kind, given);
                let b = i.encode();
                let dir = if kind == Kind::Dir { FIELD_DIR } else { 0 };
                assert_eq!((b[0], b[1]), (3, given | dir), "{kind:?} {given:#x}");
                assert_eq!(Inode::decode(9, &b), Some(i.clone()), "{kind:?} {given:#x}");
                assert_eq!(inline_chunk(&b), None);
                for cut in 0..b.len() {
                    assert_eq!(Inode::decode(9, &b[..cut]), None, "cut at {cut}");
                }
                // Version 2 held every field: perm and gid two bytes here, the others one.
                let left_out: usize = [(FIELD_PERM, 2), (FIELD_GID, 2), (FIELD_NLINK, 1)]
                    .into_iter()
                    .chain([FIELD_ATIME, FIELD_CTIME, FIELD_CRTIME].map(|f| (f, 1)))
                    .filter(|&(f, _)| given & f == 0)
                    .map(|(_, n)| n)
                    .sum();
                assert_eq!(b.len() + left_out, i.encode_version_2(None).len());
                let with = i.encode_with(Some(&encode_inline(&data)));
                assert_eq!(Inode::decode(9, &with), Some(i.clone()));
                assert_eq!(inline_chunk(&with), Some(InlineChunk::Content(&data[..])));
                assert_eq!(inline_part(&with), Some(&encode_inline(&data)[..]));
            }
        }
        // A file with every field at its usual value: flags, uid (2), size, parent, mtime,
        // name length and name.
        let plain = with_fields(Kind::File, 0).encode();
        assert_eq!(plain.len(), 2 + 2 + 1 + 1 + 8 + 1 + 4);
        assert_eq!(
            plain.len() + 8,
            with_fields(Kind::File, 0).encode_version_2(None).len()
        );
    }

    #[test]
    fn a_record_with_an_unknown_flag_is_refused() {
        let mut b = with_fields(Kind::File, 0).encode();
        assert!(Inode::decode(9, &b).is_some());
        b[1] |= 128;
        assert_eq!(Inode::decode(9, &b), None);
        assert_eq!(inline_part(&b), None);
    }

    #[test]
    fn a_version_2_record_still_decodes_with_its_inline_chunk() {
        let data = b"the content a format-7 store holds".to_vec();
        for i in [
            sample(),
            with_fields(Kind::File, 0),
            with_fields(Kind::Dir, 8),
        ] {
            let b = i.encode_version_2(None);
            assert_eq!((b[0], b[1]), (2, i.kind.to_byte()));
            assert_eq!(Inode::decode(i.ino, &b), Some(i.clone()));
            assert_eq!(inline_part(&b), None);
            let with = i.encode_version_2(Some(&encode_inline(&data)));
            assert_eq!(Inode::decode(i.ino, &with), Some(i.clone()));
            assert_eq!(inline_chunk(&with), Some(InlineChunk::Content(&data[..])));
            // A before-image of a format-7 store: kept in the index without its content,
            // as a delta, redacted; each still reads back.
            let indexed = index_form(&with).unwrap();
            assert!(content_in_record(&indexed));
            assert_eq!(Inode::decode(i.ino, &indexed), Some(i.clone()));
            let later = i.encode_with(Some(&encode_inline(b"the content a format-8 store holds")));
            let d = delta_form(&with, i.ino, b"the content a format-8 store holds", 1).unwrap();
            assert_eq!(with_kept_content(&d, &later), Some(with.clone()));
            let red = redact_inline(&with);
            assert_eq!(inline_chunk(&red), Some(InlineChunk::Redacted));
            assert_eq!(Inode::decode(i.ino, &red), Some(i.clone()));
            // Rewritten, it takes version 3 and keeps its chunk.
            let again = i.encode_with(inline_part(&with));
            assert_eq!(again[0], 3);
            assert_eq!(inline_part(&again), inline_part(&with));
            assert!(again.len() < with.len());
        }
    }

    /// A record as format 4 and before wrote it: fixed fields.
    fn version_1(i: &Inode) -> Vec<u8> {
        let mut out = vec![1, i.kind.to_byte()];
        out.extend_from_slice(&i.perm.to_le_bytes());
        out.extend_from_slice(&i.uid.to_le_bytes());
        out.extend_from_slice(&i.gid.to_le_bytes());
        out.extend_from_slice(&i.size.to_le_bytes());
        out.extend_from_slice(&i.nlink.to_le_bytes());
        out.extend_from_slice(&i.parent.to_le_bytes());
        for t in [i.atime, i.mtime, i.ctime, i.crtime] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&(i.name.len() as u16).to_le_bytes());
        out.extend_from_slice(i.name.as_bytes());
        out
    }

    #[test]
    fn a_version_1_record_still_decodes_and_has_no_inline_chunk() {
        let i = sample();
        let b = version_1(&i);
        assert_eq!(b.len(), 68 + i.name.len());
        assert_eq!(Inode::decode(42, &b), Some(i.clone()));
        assert_eq!(inline_part(&b), None);
        // Rewritten, it takes the compact form.
        assert_eq!(Inode::decode(42, &i.encode_with(inline_part(&b))), Some(i));
    }

    #[test]
    fn extreme_fields_round_trip_in_the_compact_form() {
        let mut i = sample();
        i.perm = u32::MAX;
        i.uid = u32::MAX;
        i.size = u64::MAX;
        i.parent = u64::MAX;
        i.atime = i64::MIN;
        i.mtime = i64::MAX;
        i.ctime = i64::MIN;
        i.crtime = i64::MAX;
        i.name = "n".repeat(255);
        for b in [i.encode(), i.encode_version_2(None)] {
            assert_eq!(Inode::decode(42, &b), Some(i.clone()));
            for cut in 0..b.len() {
                assert_eq!(Inode::decode(42, &b[..cut]), None, "cut at {cut}");
            }
        }
    }

    #[test]
    fn an_inline_chunk_rides_in_a_version_3_record() {
        let i = sample();
        assert_eq!(inline_chunk(&i.encode()), None);
        let data = b"a small memory".to_vec();
        let b = i.encode_with(Some(&encode_inline(&data)));
        assert_eq!(b[0], 3);
        assert_eq!(Inode::decode(42, &b), Some(i.clone()));
        assert_eq!(inline_chunk(&b), Some(InlineChunk::Content(&data[..])));
        assert_eq!(inline_part(&b), Some(&encode_inline(&data)[..]));
        // Rewriting the fields keeps the chunk.
        let mut j = i.clone();
        j.size = 99;
        let b2 = j.encode_with(inline_part(&b));
        assert_eq!(inline_chunk(&b2), Some(InlineChunk::Content(&data[..])));
        let mut bad = b.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(inline_chunk(&bad), Some(InlineChunk::Damaged));
        assert!(inline_is_damaged(&bad));
        let red = redact_inline(&b);
        assert_eq!(inline_chunk(&red), Some(InlineChunk::Redacted));
        assert_eq!(Inode::decode(42, &red), Some(i.clone()));
        // A record with fewer bytes after its name than a chunk's header is no record.
        assert_eq!(Inode::decode(42, &b[..b.len() - data.len() - 1]), None);
        let mut long = i.encode();
        long.push(0);
        assert_eq!(Inode::decode(42, &long), None);
    }

    /// `decode_with_inline` parses a record once and gives what `decode` and `inline_chunk`
    /// give, for every form a record takes: no chunk, a chunk, a damaged or redacted one,
    /// version 1, and bytes that are no record.
    #[test]
    fn decoding_with_the_inline_chunk_agrees_with_decoding_apart() {
        let i = sample();
        let data = b"a small memory".to_vec();
        let with = i.encode_with(Some(&encode_inline(&data)));
        let mut damaged = with.clone();
        *damaged.last_mut().unwrap() ^= 1;
        let mut long = i.encode();
        long.push(0);
        for b in [
            i.encode(),
            with.clone(),
            damaged,
            redact_inline(&with),
            version_1(&i),
            with[..with.len() - data.len() - 1].to_vec(),
            long,
            Vec::new(),
        ] {
            let apart = Inode::decode(42, &b).map(|i| (i, inline_chunk(&b)));
            let once = decode_with_inline(42, &b).map(|(mut i, name, inline)| {
                assert!(i.name.is_empty());
                i.name = name.to_string();
                (i, inline)
            });
            assert_eq!(once, apart, "{b:?}");
        }
    }

    #[test]
    fn unknown_record_version_is_refused() {
        let mut b = sample().encode();
        b[0] = 4;
        assert_eq!(Inode::decode(42, &b), None);
        assert_eq!(Inode::decode(42, &sample().encode()[..10]), None);
    }
}

/// What lies below one directory, and its quota (see "Per-directory aggregates").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SubtreeRecord {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Upper bound of the levels of the deepest entry below, relative to the directory.
    pub depth: u32,
    /// Upper bound of the bytes of the longest path below, relative to the directory.
    pub path_bytes: u32,
    /// Content bytes allowed below (0: no limit).
    pub quota_bytes: u64,
    /// Files and directories allowed below (0: no limit).
    pub quota_files: u64,
}

/// The fixed-width record of format 7 and before; still read, no longer written.
const SUBTREE_RECORD_VERSION: u8 = 1;
const SUBTREE_RECORD_LEN: usize = 49;
/// The record this build writes (format 8): the same fields as varints.
const SUBTREE_RECORD_VARINTS: u8 = 2;

impl SubtreeRecord {
    /// Files and directories below.
    pub fn entries(&self) -> u64 {
        self.files.saturating_add(self.dirs)
    }

    pub fn has_quota(&self) -> bool {
        self.quota_bytes > 0 || self.quota_files > 0
    }

    /// The record, version 2 (see "Per-directory aggregates"): the quota fields only when
    /// the directory has a quota.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.push(SUBTREE_RECORD_VARINTS);
        let fields = self.fields();
        let n = if self.has_quota() { 7 } else { 5 };
        for v in &fields[..n] {
            put_varint(&mut out, *v);
        }
        out
    }

    /// The record as version 1 wrote it (format 7 and before). Tests make older stores with
    /// it.
    #[doc(hidden)]
    pub fn encode_version_1(&self) -> [u8; SUBTREE_RECORD_LEN] {
        let mut out = [0u8; SUBTREE_RECORD_LEN];
        out[0] = SUBTREE_RECORD_VERSION;
        out[1..9].copy_from_slice(&self.files.to_le_bytes());
        out[9..17].copy_from_slice(&self.dirs.to_le_bytes());
        out[17..25].copy_from_slice(&self.bytes.to_le_bytes());
        out[25..29].copy_from_slice(&self.depth.to_le_bytes());
        out[29..33].copy_from_slice(&self.path_bytes.to_le_bytes());
        out[33..41].copy_from_slice(&self.quota_bytes.to_le_bytes());
        out[41..49].copy_from_slice(&self.quota_files.to_le_bytes());
        out
    }

    /// The fields in the order both versions hold them.
    fn fields(&self) -> [u64; 7] {
        [
            self.files,
            self.dirs,
            self.bytes,
            u64::from(self.depth),
            u64::from(self.path_bytes),
            self.quota_bytes,
            self.quota_files,
        ]
    }

    /// Decodes a record of either version; `None` when the bytes are not a subtree record.
    pub fn decode(b: &[u8]) -> Option<SubtreeRecord> {
        match *b.first()? {
            SUBTREE_RECORD_VERSION if b.len() == SUBTREE_RECORD_LEN => {
                let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
                let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
                Some(SubtreeRecord {
                    files: u64_at(1),
                    dirs: u64_at(9),
                    bytes: u64_at(17),
                    depth: u32_at(25),
                    path_bytes: u32_at(29),
                    quota_bytes: u64_at(33),
                    quota_files: u64_at(41),
                })
            }
            SUBTREE_RECORD_VARINTS => {
                let mut at = 1;
                let mut f = [0u64; 7];
                for (n, v) in f.iter_mut().enumerate() {
                    // No quota: the record ends after the bounds.
                    if n == 5 && at == b.len() {
                        break;
                    }
                    *v = take_varint(b, &mut at)?;
                }
                if at != b.len() {
                    return None;
                }
                Some(SubtreeRecord {
                    files: f[0],
                    dirs: f[1],
                    bytes: f[2],
                    depth: u32::try_from(f[3]).ok()?,
                    path_bytes: u32::try_from(f[4]).ok()?,
                    quota_bytes: f[5],
                    quota_files: f[6],
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod subtree_tests {
    use super::*;

    fn sample() -> SubtreeRecord {
        SubtreeRecord {
            files: 1,
            dirs: 2,
            bytes: 3 << 40,
            depth: 4,
            path_bytes: 5,
            quota_bytes: 6,
            quota_files: 7,
        }
    }

    #[test]
    fn a_subtree_record_round_trips() {
        let r = sample();
        let b = r.encode();
        assert_eq!(b[0], 2);
        // Six one-byte fields and one of six bytes (3 << 40 needs 42 bits).
        assert_eq!(b.len(), 1 + 6 + 6);
        assert_eq!(SubtreeRecord::decode(&b), Some(r));
        for cut in 0..b.len() {
            // Cut after the bounds, it is the record without a quota.
            let want = (cut == 1 + 4 + 6).then_some(SubtreeRecord {
                quota_bytes: 0,
                quota_files: 0,
                ..r
            });
            assert_eq!(SubtreeRecord::decode(&b[..cut]), want, "cut at {cut}");
        }
        // Without a quota, the record ends after the bounds; either quota field alone
        // brings both.
        let plain = SubtreeRecord {
            quota_bytes: 0,
            quota_files: 0,
            ..r
        };
        assert_eq!(plain.encode().len(), 1 + 4 + 6);
        assert_eq!(SubtreeRecord::decode(&plain.encode()), Some(plain));
        for (quota_bytes, quota_files) in [(6, 0), (0, 7)] {
            let q = SubtreeRecord {
                quota_bytes,
                quota_files,
                ..r
            };
            assert_eq!(q.encode().len(), 1 + 4 + 6 + 2);
            assert_eq!(SubtreeRecord::decode(&q.encode()), Some(q));
        }
        // One quota field without the other is no record.
        let mut half = plain.encode();
        half.push(6);
        assert_eq!(SubtreeRecord::decode(&half), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(SubtreeRecord::decode(&long), None);
        let mut bad = b;
        bad[0] = 3;
        assert_eq!(SubtreeRecord::decode(&bad), None);
        let max = SubtreeRecord {
            files: u64::MAX,
            dirs: u64::MAX,
            bytes: u64::MAX,
            depth: u32::MAX,
            path_bytes: u32::MAX,
            quota_bytes: u64::MAX,
            quota_files: u64::MAX,
        };
        assert_eq!(SubtreeRecord::decode(&max.encode()), Some(max));
        // A depth past a u32 is no record.
        let mut over = vec![2, 0, 0, 0];
        put_varint(&mut over, u64::from(u32::MAX) + 1);
        over.extend_from_slice(&[0, 0, 0]);
        assert_eq!(SubtreeRecord::decode(&over), None);
    }

    #[test]
    fn a_version_1_subtree_record_still_decodes() {
        let r = sample();
        let b = r.encode_version_1();
        assert_eq!(b[0], 1);
        assert_eq!(&b[17..25], &(3u64 << 40).to_le_bytes());
        assert_eq!(SubtreeRecord::decode(&b), Some(r));
        assert_eq!(SubtreeRecord::decode(&b[..48]), None);
        let mut bad = b;
        bad[0] = 2;
        assert_eq!(SubtreeRecord::decode(&bad), None);
    }
}

/// A blob's stored value: the CRC-32C of `data`, then `data`.
pub fn encode_blob(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + data.len());
    out.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A blob's content, once its checksum matches; None when it does not (or the value is too
/// short to hold one, or is a delta: see `decode_blob_value`). An empty value is a redacted
/// blob: empty content.
pub fn decode_blob(raw: &[u8]) -> Option<&[u8]> {
    match decode_blob_value(raw)? {
        BlobValue::Full(data) => Some(data),
        BlobValue::Delta { .. } => None,
    }
}

/// Version byte of a delta blob's value.
const DELTA_BLOB_VERSION: u8 = 1;

/// What a blob's value holds (see "Delta blobs").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobValue<'a> {
    /// The content itself (empty for a redacted blob).
    Full(&'a [u8]),
    /// The content as a delta against blob `base` (`store::delta`); `behind` is the longest
    /// run of deltas that led to this blob when it became one.
    Delta {
        base: u64,
        behind: u8,
        delta: &'a [u8],
    },
}

/// A delta blob's value: the complement of the CRC-32C of what follows (so it never passes
/// for a full blob), then version, base, `behind` and the delta.
pub fn encode_delta_blob(base: u64, behind: u8, delta: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + delta.len());
    out.extend_from_slice(&[0; 4]);
    out.push(DELTA_BLOB_VERSION);
    out.extend_from_slice(&base.to_le_bytes());
    out.push(behind);
    out.extend_from_slice(delta);
    let sum = !crc32c::crc32c(&out[4..]);
    out[..4].copy_from_slice(&sum.to_le_bytes());
    out
}

/// A blob's value decoded, once its checksum matches; None when it matches neither form.
pub fn decode_blob_value(raw: &[u8]) -> Option<BlobValue<'_>> {
    if raw.is_empty() {
        return Some(BlobValue::Full(raw));
    }
    let (sum, data) = raw.split_at_checked(4)?;
    let sum = u32::from_le_bytes(sum.try_into().unwrap());
    let crc = crc32c::crc32c(data);
    if crc == sum {
        return Some(BlobValue::Full(data));
    }
    if !crc != sum || data.len() < 10 || data[0] != DELTA_BLOB_VERSION {
        return None;
    }
    Some(BlobValue::Delta {
        base: u64::from_le_bytes(data[1..9].try_into().unwrap()),
        behind: data[9],
        delta: &data[10..],
    })
}

/// The length of the content a (checksum-verified or not) blob value stands for.
pub fn blob_content_len(raw: &[u8]) -> u64 {
    match decode_blob_value(raw) {
        Some(BlobValue::Delta { delta, .. }) => super::delta::target_len(delta).unwrap_or(0),
        _ => raw.len().saturating_sub(4) as u64,
    }
}

#[cfg(test)]
mod blob_tests {
    use super::*;

    #[test]
    fn a_blob_round_trips_and_a_flipped_bit_is_caught() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let mut raw = encode_blob(&data);
        assert_eq!(decode_blob(&raw), Some(data.as_slice()));
        raw[1234] ^= 0x10;
        assert_eq!(decode_blob(&raw), None);
        assert_eq!(decode_blob(&[]), Some(&[][..]), "a redacted blob is empty");
        assert_eq!(decode_blob(&[1, 2]), None);
    }

    #[test]
    fn a_delta_blob_round_trips_and_never_reads_as_full() {
        let delta = super::super::delta::diff(b"hello world", b"hello there world");
        let mut raw = encode_delta_blob(42, 3, &delta);
        assert_eq!(
            decode_blob_value(&raw),
            Some(BlobValue::Delta {
                base: 42,
                behind: 3,
                delta: &delta
            })
        );
        assert_eq!(decode_blob(&raw), None, "a delta is not full content");
        assert_eq!(blob_content_len(&raw), 11);
        raw[7] ^= 4;
        assert_eq!(decode_blob_value(&raw), None);
        let full = encode_blob(b"content");
        assert_eq!(decode_blob_value(&full), Some(BlobValue::Full(b"content")));
        assert_eq!(blob_content_len(&full), 7);
    }
}
