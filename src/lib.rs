//! redbfs: a transactional redb store mounted as a real directory over FUSE, for AI-agent
//! memory. Layers, top to bottom: `cli` (arguments, human output), `mount` (daemon
//! lifecycle), `control` (the daemon's socket), `fuse` (the only module naming fuser), `fs`
//! (filesystem semantics, testable without a mount), `store` (the only module naming redb);
//! `private` creates every file redbfs keeps on the host, private and never through a symlink;
//! `process` tells processes apart by pid and start time; `ratelimit` keeps repeated log lines
//! to one per rule and interval, and `logfile` keeps the daemon's log file to a bounded size
//! (`STORE.log` and `STORE.log.1`); `notify` tells systemd when the mount is ready and when it
//! stops; `tools` are the operations on a store file (snapshot,
//! export, import, history ...) the CLI and the control socket share; `replica` ships a
//! mounted store's commits to object storage and restores from there.

pub mod check;
pub mod cli;
pub mod control;
pub mod fs;
pub mod fuse;
pub mod logfile;
pub mod mount;
pub mod notify;
pub mod private;
pub mod process;
pub mod ratelimit;
pub mod replica;
pub mod store;
pub mod tools;
