//! The filesystem's error type and its one mapping to errno. Each variant names the rule or
//! failure; `errno` is the only place that decides what a caller sees.

use std::fmt;

use super::name::NameError;
use crate::store::StoreError;

#[derive(Debug)]
pub enum Error {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    /// A name broke a rule of the normaliser.
    Name(NameError),
    /// The path from the mount root would exceed `--max-path-bytes`.
    PathTooLong {
        bytes: usize,
        limit: usize,
    },
    /// The path from the mount root would exceed `--max-depth` levels.
    TooDeep {
        depth: usize,
        limit: usize,
    },
    /// Only regular files and directories exist (symlink, link, FIFO, socket, device).
    NotPermitted(&'static str),
    /// Extended attributes are not stored.
    XattrUnsupported,
    /// An operation the store does not offer (fallocate).
    Unsupported(&'static str),
    /// A request that makes no sense for its target (a directory into its own subtree, ...).
    Invalid(&'static str),
    /// A file handle the daemon does not know.
    BadHandle,
    /// A write or truncation beyond `--max-file-bytes`.
    FileTooBig {
        limit: u64,
    },
    /// Over `--quota` content bytes.
    QuotaExceeded {
        limit: u64,
    },
    /// Over `--max-files` files and directories.
    TooManyFiles {
        limit: u64,
    },
    /// Over the quota of directory `root` (`redbfs quota`): `limit` content bytes, or when
    /// `files`, files and directories below it.
    DirQuota {
        root: String,
        files: bool,
        limit: u64,
    },
    /// A history request that cannot be met (history off, expired, no such point).
    History(String),
    /// A replace that would overwrite another process's edit made after this process last
    /// read the file (`--lost-updates refuse`).
    LostUpdate {
        maker: u32,
    },
    /// The mount is read-only (`--read-only`, `-o ro`).
    ReadOnly,
    /// On a follower: the inode the kernel named went with a batch from the writer (a
    /// replace by rename, a removal). ESTALE makes the kernel look the path up again.
    Stale,
    /// A previous commit failed; writes are refused until restart.
    Poisoned,
    Store(StoreError),
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Stale => libc::ESTALE,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Name(e) => e.errno(),
            Error::PathTooLong { .. } => libc::ENAMETOOLONG,
            // What Linux returns for too many levels in a path walk.
            Error::TooDeep { .. } => libc::ELOOP,
            Error::NotPermitted(_) => libc::EPERM,
            // ENOTSUP, not ENOSYS: cp -a and tar treat it as "no xattrs here" and carry on.
            Error::XattrUnsupported => libc::ENOTSUP,
            // EOPNOTSUPP makes glibc's posix_fallocate fall back to writing zeros.
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Invalid(_) => libc::EINVAL,
            Error::BadHandle => libc::EBADF,
            Error::FileTooBig { .. } => libc::EFBIG,
            Error::QuotaExceeded { .. } => libc::ENOSPC,
            // No inodes left, as df -i would show.
            Error::TooManyFiles { .. } => libc::ENOSPC,
            // "Disk quota exceeded", as a user's quota on a shared disk answers.
            Error::DirQuota { .. } | Error::Store(StoreError::DirQuota { .. }) => libc::EDQUOT,
            Error::History(_) => libc::EINVAL,
            // "Resource temporarily unavailable": the SDK's edit commands re-read the file
            // when the model retries, so a retry applies the edit to the current content.
            Error::LostUpdate { .. } => libc::EAGAIN,
            Error::ReadOnly => libc::EROFS,
            Error::Poisoned => libc::EIO,
            Error::Store(StoreError::Full | StoreError::NoRoom) => libc::ENOSPC,
            // A change that reached a store opened read-only (every path checks first).
            Error::Store(StoreError::ReadOnly) => libc::EROFS,
            Error::Store(_) => libc::EIO,
        }
    }

    /// The rule broken or the failure, as a fixed text: the key a refusal's log line is
    /// rate-limited by. Never the message, which carries what the caller chose (a name's
    /// length, a character, a path's bytes): keyed by it, a client that varied those had
    /// every refusal logged.
    pub fn rule(&self) -> &'static str {
        match self {
            Error::NotFound => "not-found",
            Error::Stale => "stale",
            Error::Exists => "exists",
            Error::NotDir => "not-dir",
            Error::IsDir => "is-dir",
            Error::NotEmpty => "not-empty",
            Error::Name(e) => e.rule(),
            Error::PathTooLong { .. } => "max-path-bytes",
            Error::TooDeep { .. } => "max-depth",
            // Words of the code's own, each a rule of its own (a symlink, a FIFO; a rename of
            // a directory into itself).
            Error::NotPermitted(what) | Error::Unsupported(what) | Error::Invalid(what) => what,
            Error::XattrUnsupported => "xattr-unsupported",
            Error::BadHandle => "bad-handle",
            Error::FileTooBig { .. } => "max-file-bytes",
            Error::QuotaExceeded { .. } => "quota",
            Error::TooManyFiles { .. } => "max-files",
            Error::DirQuota { .. } => "dir-quota",
            Error::History(_) => "history",
            Error::LostUpdate { .. } => "lost-update",
            Error::ReadOnly => "read-only",
            Error::Poisoned => "poisoned",
            Error::Store(e) => e.kind(),
        }
    }

    /// Whether this is an ordinary answer (ENOENT on a lookup, say) rather than a refusal
    /// worth a warn line.
    pub fn is_expected(&self) -> bool {
        matches!(
            self,
            Error::NotFound
                | Error::Stale
                | Error::Exists
                | Error::NotEmpty
                | Error::NotDir
                | Error::IsDir
            // Logged once, naming both processes, where it was decided.
            | Error::LostUpdate { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => write!(f, "no such file or directory"),
            Error::Stale => write!(
                f,
                "replaced by a newer commit of the writer; look it up again"
            ),
            Error::Exists => write!(f, "already exists"),
            Error::NotDir => write!(f, "not a directory"),
            Error::IsDir => write!(f, "is a directory"),
            Error::NotEmpty => write!(f, "directory not empty"),
            Error::Name(e) => write!(f, "{e}"),
            Error::PathTooLong { bytes, limit } => {
                write!(
                    f,
                    "path would be {bytes} bytes, over --max-path-bytes {limit}"
                )
            }
            Error::TooDeep { depth, limit } => {
                write!(
                    f,
                    "path would be {depth} levels deep, over --max-depth {limit}"
                )
            }
            Error::NotPermitted(what) => {
                write!(
                    f,
                    "{what}: only regular files and directories exist in a store"
                )
            }
            Error::XattrUnsupported => write!(f, "extended attributes are not supported"),
            Error::Unsupported(what) => write!(f, "{what} is not supported"),
            Error::Invalid(why) => write!(f, "{why}"),
            Error::BadHandle => write!(f, "unknown file handle"),
            Error::FileTooBig { limit } => write!(f, "file would exceed --max-file-bytes {limit}"),
            Error::QuotaExceeded { limit } => {
                write!(f, "store would exceed --quota of {limit} content bytes")
            }
            Error::TooManyFiles { limit } => write!(f, "store would exceed --max-files {limit}"),
            Error::DirQuota {
                root,
                files: false,
                limit,
            } => write!(f, "{root} would exceed its quota of {limit} content bytes"),
            Error::DirQuota {
                root,
                files: true,
                limit,
            } => write!(
                f,
                "{root} would exceed its quota of {limit} files and directories"
            ),
            Error::History(m) => write!(f, "{m}"),
            Error::LostUpdate { maker } => write!(
                f,
                "pid {maker} changed the file after this process last read it; read it again and retry (--lost-updates refuse)"
            ),
            Error::ReadOnly => write!(
                f,
                "the mount is read-only (--read-only, a follower, or a writer fenced by a newer one: `redbfs status` says which)"
            ),
            Error::Poisoned => write!(
                f,
                "an earlier commit failed; the store refuses writes until the daemon restarts"
            ),
            Error::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

impl From<NameError> for Error {
    fn from(e: NameError) -> Self {
        Error::Name(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_table() {
        assert_eq!(Error::NotFound.errno(), libc::ENOENT);
        assert_eq!(Error::NotEmpty.errno(), libc::ENOTEMPTY);
        assert_eq!(Error::NotPermitted("symlink").errno(), libc::EPERM);
        assert_eq!(Error::XattrUnsupported.errno(), libc::ENOTSUP);
        assert_eq!(Error::FileTooBig { limit: 1 }.errno(), libc::EFBIG);
        assert_eq!(Error::QuotaExceeded { limit: 1 }.errno(), libc::ENOSPC);
        assert_eq!(Error::Poisoned.errno(), libc::EIO);
        assert_eq!(Error::ReadOnly.errno(), libc::EROFS);
        assert_eq!(Error::Store(StoreError::ReadOnly).errno(), libc::EROFS);
        assert_eq!(Error::Store(StoreError::Full).errno(), libc::ENOSPC);
        assert_eq!(Error::Invalid("x").errno(), libc::EINVAL);
        assert_eq!(Error::LostUpdate { maker: 1 }.errno(), libc::EAGAIN);
        let q = Error::DirQuota {
            root: "/u1".into(),
            files: false,
            limit: 10,
        };
        assert_eq!(q.errno(), libc::EDQUOT);
        assert!(q.to_string().contains("/u1"));
    }

    /// Regression: refusals were rate-limited by their message, which names what the client
    /// chose, so 200 name lengths logged 200 different lines over and over. The rule is the
    /// same whatever the client chose.
    #[test]
    fn the_rule_names_no_value_the_client_chose() {
        let same = |a: Error, b: Error| assert_eq!(a.rule(), b.rule(), "{a} / {b}");
        same(
            Error::Name(NameError::TooLong(256)),
            Error::Name(NameError::TooLong(455)),
        );
        same(
            Error::Name(NameError::Control('\n')),
            Error::Name(NameError::Control('\u{7f}')),
        );
        same(
            Error::PathTooLong {
                bytes: 65,
                limit: 64,
            },
            Error::PathTooLong {
                bytes: 4000,
                limit: 64,
            },
        );
        same(
            Error::TooDeep { depth: 9, limit: 8 },
            Error::TooDeep {
                depth: 90,
                limit: 8,
            },
        );
        same(
            Error::History("no version of /a at that point".into()),
            Error::History("no version of /b at that point".into()),
        );
        assert_ne!(
            Error::Name(NameError::TooLong(256)).rule(),
            Error::Name(NameError::Control('\n')).rule()
        );
    }
}
