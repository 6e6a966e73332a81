//! The command line: the only place that parses arguments and prints for people.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use crate::control;
use crate::fs::NameRules;
use crate::mount::{self, LimitOverrides, MountRequest};
use crate::store::Store;

#[derive(Parser, Debug)]
#[command(
    name = "redbfs",
    version,
    about = "A transactional redb store mounted as a directory, for AI-agent memory"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Names {
    /// Linux rules: UTF-8, NFC, no control or invisible format characters.
    Linux,
    /// Also no Windows-reserved characters or names, no trailing dot or space, and no
    /// siblings that differ only in case.
    Portable,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Mount a store (created if missing) on MOUNTPOINT; returns once the mount answers.
    Mount {
        mountpoint: PathBuf,
        /// The store file [default: MOUNTPOINT.redb beside the mountpoint].
        #[arg(long)]
        store: Option<PathBuf>,
        /// Stay attached; SIGINT or SIGTERM unmounts cleanly.
        #[arg(long)]
        foreground: bool,
        /// Write the daemon's log here [default: STORE.log in the background, stderr in the foreground].
        #[arg(long)]
        log_file: Option<PathBuf>,
        /// Let other users enter the mount (permissions are still checked by the kernel).
        #[arg(long)]
        allow_other: bool,
        /// More log: -v logs every request.
        #[arg(short, long, action = clap::ArgAction::Count)]
        verbose: u8,
        /// Threads serving kernel requests.
        #[arg(long, default_value_t = crate::fuse::DEFAULT_THREADS)]
        threads: usize,
        /// Largest file (EFBIG beyond), e.g. 256M. Kept in the store.
        #[arg(long, value_parser = parse_size)]
        max_file_bytes: Option<u64>,
        /// Total content bytes (ENOSPC beyond), e.g. 10G; 0 for none. Kept in the store.
        #[arg(long, value_parser = parse_size)]
        quota: Option<u64>,
        /// Files plus directories (ENOSPC beyond). Kept in the store.
        #[arg(long)]
        max_files: Option<u64>,
        /// Longest path from the mount root, in bytes (ENAMETOOLONG beyond). Kept in the store.
        #[arg(long)]
        max_path_bytes: Option<usize>,
        /// Deepest path from the mount root, in levels (ELOOP beyond). Kept in the store.
        #[arg(long)]
        max_depth: Option<usize>,
        /// Name rules. Kept in the store.
        #[arg(long, value_enum)]
        names: Option<Names>,
        /// (internal) report readiness on this descriptor
        #[arg(long, hide = true)]
        notify_fd: Option<i32>,
    },
    /// Unmount; returns once the daemon has closed the store.
    Unmount { mountpoint: PathBuf },
    /// Show a mount's or a store's state.
    Status {
        /// A mountpoint or a store file.
        target: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Check a store's integrity and the filesystem invariants (exit 1 on findings).
    Check {
        /// A store file or a mountpoint.
        target: PathBuf,
        #[arg(long)]
        json: bool,
    },
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

fn init_logging(verbose: u8, log_file: Option<&Path>) -> Result<(), String> {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("REDBFS_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("redbfs={level},fuser=warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match log_file {
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("log file {}: {e}", p.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    // fuser logs through the `log` crate.
    let _ = tracing_log::LogTracer::init();
    Ok(())
}

/// The store behind TARGET: the store file itself, or the store of a redbfs mountpoint.
fn resolve_store(target: &Path) -> Result<(PathBuf, bool), String> {
    let abs = mount::absolute(target)?;
    if let Some(store) = mount::redbfs_mount_at(&abs) {
        return Ok((store, true));
    }
    if abs.is_file() {
        let mounted = mount::mountpoint_of_store(&abs).is_some();
        return Ok((abs, mounted));
    }
    Err(format!(
        "{}: neither a store file nor a redbfs mountpoint",
        target.display()
    ))
}

pub fn main() -> i32 {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("redbfs: {e}");
            1
        }
    }
}

fn run(cli: Cli) -> Result<i32, String> {
    match cli.cmd {
        Cmd::Mount {
            mountpoint,
            store,
            foreground,
            log_file,
            allow_other,
            verbose,
            threads,
            max_file_bytes,
            quota,
            max_files,
            max_path_bytes,
            max_depth,
            names,
            notify_fd,
        } => {
            let daemon = foreground || notify_fd.is_some();
            if daemon {
                let log = match (&log_file, notify_fd) {
                    (Some(p), _) => Some(p.clone()),
                    (None, Some(_)) => {
                        let s = store
                            .clone()
                            .unwrap_or_else(|| mount::default_store(&mountpoint));
                        let mut p = s.into_os_string();
                        p.push(".log");
                        Some(PathBuf::from(p))
                    }
                    (None, None) => None,
                };
                init_logging(verbose, log.as_deref())?;
            }
            let argv: Vec<String> = std::env::args().skip(1).collect();
            let req = MountRequest {
                mountpoint,
                store,
                foreground,
                allow_other,
                threads,
                limits: LimitOverrides {
                    max_file_bytes,
                    quota_bytes: quota,
                    max_files,
                    max_path_bytes,
                    max_depth,
                    names: names.map(|n| match n {
                        Names::Linux => NameRules::Linux,
                        Names::Portable => NameRules::Portable,
                    }),
                },
                argv,
                notify_fd,
            };
            mount::mount(req)?;
            Ok(0)
        }
        Cmd::Unmount { mountpoint } => {
            let msg = mount::unmount(&mountpoint)?;
            eprintln!("redbfs: {msg}");
            Ok(0)
        }
        Cmd::Status { target, json } => {
            let (store, mounted) = resolve_store(&target)?;
            let v = if mounted {
                control::Client::connect(&store)
                    .map_err(|e| format!("{}: the daemon does not answer: {e}", store.display()))?
                    .call(&json!({"op": "status"}))?
            } else {
                let s = Store::open_existing(&store).map_err(|e| e.to_string())?;
                let u = s
                    .read()
                    .and_then(|r| r.usage())
                    .map_err(|e| e.to_string())?;
                json!({"ok": true, "mountpoint": null, "store": store, "format": crate::store::FORMAT_VERSION,
                       "files": u.files, "dirs": u.dirs, "content_bytes": u.content_bytes, "store_bytes": s.file_bytes()})
            };
            if json {
                println!("{v}");
            } else {
                let mp = v["mountpoint"].as_str().unwrap_or("(not mounted)");
                println!("store:      {}", v["store"].as_str().unwrap_or(""));
                println!("mountpoint: {mp}");
                println!("format:     {}", v["format"]);
                println!("files:      {}", v["files"]);
                println!("dirs:       {}", v["dirs"]);
                println!("content:    {} bytes", v["content_bytes"]);
                println!("store file: {} bytes", v["store_bytes"]);
                if let Some(pid) = v["pid"].as_u64() {
                    println!("daemon pid: {pid}");
                    println!("open files: {}", v["open_handles"]);
                }
            }
            Ok(0)
        }
        Cmd::Check { target, json } => {
            let (store, mounted) = resolve_store(&target)?;
            if mounted {
                return Err(format!(
                    "{} is mounted; unmount it to check (a live check through the daemon is not built yet)",
                    store.display()
                ));
            }
            let mut s = Store::open_existing(&store).map_err(|e| e.to_string())?;
            let mut findings = Vec::new();
            match s.check_integrity() {
                Ok(true) => {}
                Ok(false) => findings.push("redb integrity check repaired the file".to_string()),
                Err(e) => findings.push(format!("redb integrity check failed: {e}")),
            }
            let r = s.read().map_err(|e| e.to_string())?;
            findings.extend(crate::check::invariants(&r).map_err(|e| e.to_string())?);
            if json {
                println!(
                    "{}",
                    json!({"ok": findings.is_empty(), "findings": findings})
                );
            } else if findings.is_empty() {
                println!("{}: clean", store.display());
            } else {
                for f in &findings {
                    println!("{f}");
                }
            }
            Ok(if findings.is_empty() { 0 } else { 1 })
        }
    }
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
