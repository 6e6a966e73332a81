//! The store's tables and the byte layout of every record: the one place that says what is on
//! disk. Encodings are explicit little-endian layouts with a leading version byte, written by
//! hand, so the file format does not depend on the compiler's layout or the machine's endianness.
//!
//! # Tables (format version 1)
//!
//! ```text
//! meta     &str            -> &[u8]     "format" u32: the store format version (FORMAT_VERSION)
//!                                       "next_ino" u64: next inode number; never reused
//!                                       "next_blob" u64: next blob id; never reused
//!                                       "created" i64: creation time, ns since the epoch
//!                                       "limits" &[u8]: the mount limits as JSON, kept so a
//!                                       restart keeps them
//! inodes   u64 ino         -> &[u8]     an `Inode` record (below); ino 1 is the root
//! dirents  (u64, &str)     -> (u64, u8) (parent ino, NFC name) -> (child ino, kind byte);
//!                                       readdir is a range scan over one parent
//! filemap  (u64, u64)      -> u64       (ino, chunk index) -> blob id; a missing index is a hole
//! blobs    u64 blob id     -> &[u8]     chunk content, at most CHUNK_SIZE bytes, immutable once
//!                                       written: a write makes a new blob and repoints filemap,
//!                                       so a later history table can keep referencing old blobs
//!                                       without copying them
//! orphans  u64 ino         -> ()        unlinked while open; reclaimed at last release or at the
//!                                       next mount
//! ```
//!
//! # Inode record, version 1 (little-endian)
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

use redb::TableDefinition;

/// The store format this build reads and writes. A store of any other version is refused.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes per content chunk. Small memories fit in one chunk; large files stream.
pub const CHUNK_SIZE: u64 = 64 * 1024;

/// The inode number of the root directory (FUSE's root id).
pub const ROOT_INO: u64 = 1;

pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
pub(crate) const DIRENTS: TableDefinition<(u64, &str), (u64, u8)> = TableDefinition::new("dirents");
pub(crate) const FILEMAP: TableDefinition<(u64, u64), u64> = TableDefinition::new("filemap");
pub(crate) const BLOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("blobs");
pub(crate) const ORPHANS: TableDefinition<u64, ()> = TableDefinition::new("orphans");

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_NEXT_INO: &str = "next_ino";
pub(crate) const META_NEXT_BLOB: &str = "next_blob";
pub(crate) const META_CREATED: &str = "created";
pub const META_LIMITS: &str = "limits";

const INODE_RECORD_VERSION: u8 = 1;
const INODE_FIXED_LEN: usize = 68;

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
    pub fn encode(&self) -> Vec<u8> {
        let name = self.name.as_bytes();
        let mut out = Vec::with_capacity(INODE_FIXED_LEN + name.len());
        out.push(INODE_RECORD_VERSION);
        out.push(self.kind.to_byte());
        out.extend_from_slice(&self.perm.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.nlink.to_le_bytes());
        out.extend_from_slice(&self.parent.to_le_bytes());
        out.extend_from_slice(&self.atime.to_le_bytes());
        out.extend_from_slice(&self.mtime.to_le_bytes());
        out.extend_from_slice(&self.ctime.to_le_bytes());
        out.extend_from_slice(&self.crtime.to_le_bytes());
        // Names are at most 255 bytes (the normaliser's rule), so u16 always fits.
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name);
        out
    }

    /// Decodes a record; `None` when the bytes are not a version-1 inode record.
    pub fn decode(ino: u64, b: &[u8]) -> Option<Inode> {
        if b.len() < INODE_FIXED_LEN || b[0] != INODE_RECORD_VERSION {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let i64_at = |o: usize| i64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let name_len = u16::from_le_bytes([b[66], b[67]]) as usize;
        let name = b.get(INODE_FIXED_LEN..INODE_FIXED_LEN + name_len)?;
        Some(Inode {
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
            name: String::from_utf8(name.to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn inode_round_trips() {
        let i = sample();
        assert_eq!(Inode::decode(42, &i.encode()), Some(i));
    }

    #[test]
    fn inode_layout_is_little_endian_and_versioned() {
        let b = sample().encode();
        assert_eq!(b[0], 1);
        assert_eq!(b[1], 1);
        assert_eq!(&b[2..6], &0o600u32.to_le_bytes());
        assert_eq!(&b[14..22], &123_456_789u64.to_le_bytes());
        assert_eq!(&b[26..34], &7u64.to_le_bytes());
        assert_eq!(b.len(), 68 + "notes \u{1F600}.md".len());
    }

    #[test]
    fn unknown_record_version_is_refused() {
        let mut b = sample().encode();
        b[0] = 2;
        assert_eq!(Inode::decode(42, &b), None);
        assert_eq!(Inode::decode(42, &b[..10]), None);
    }
}
