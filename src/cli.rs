//! The command line: the only place that parses arguments and prints for people.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

use crate::control;
use crate::fs::{LostUpdates, NameRules};
use crate::mount::{self, LimitOverrides, MountRequest};
use crate::store::{ReadOnlyStore, Store};
use crate::tools;
use std::io::Write;

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
enum LostUpdatesArg {
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
        /// Content all open files may buffer in memory before a writer's buffer moves to a
        /// private temporary file beside the store, e.g. 1G. Kept in the store [default for
        /// a new store: 1G].
        #[arg(long, value_parser = parse_size)]
        max_buffer: Option<u64>,
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
        /// What a replace (rename over a file, or open with O_TRUNC) does when the file's
        /// content was changed by another process after this process last read it. Kept in
        /// the store [default for a new store: record].
        #[arg(long, value_enum)]
        lost_updates: Option<LostUpdatesArg>,
        /// How long history keeps replaced and deleted content, e.g. 30d; 0 turns history
        /// off. Kept in the store [default for a new store: 30d].
        #[arg(long, value_parser = parse_keep)]
        keep_history: Option<u64>,
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
        /// Reclaim orphans and unreachable inodes and fix link counts (unmounted stores only).
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent point-in-time copy of a store (mounted or not) to OUT, or `-` for stdout.
    Snapshot {
        /// A store file or a mountpoint.
        source: PathBuf,
        out: PathBuf,
        /// The store as it was at a point of history: a seq, a mark, a date or `2h` (ago).
        #[arg(long)]
        at: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Replace a store (not mounted) with a checked snapshot, keeping the old one beside it.
    Restore {
        snapshot: PathBuf,
        store: PathBuf,
        /// Do not keep the replaced store as STORE.before-restore-<time>.
        #[arg(long)]
        discard_current: bool,
    },
    /// Write a store's tree, with modes and mtimes, to a new directory or a tar file.
    Export {
        /// A store file or a mountpoint.
        store: PathBuf,
        /// The directory to create.
        dir: Option<PathBuf>,
        /// Write a tar archive instead (`-` for stdout).
        #[arg(long)]
        tar: Option<PathBuf>,
        /// Export only this path of the store.
        #[arg(long, default_value = "/")]
        path: String,
        /// Give files and directories their recorded owners (root only); only then are setuid
        /// and setgid bits kept.
        #[arg(long)]
        same_owner: bool,
        /// Replace an existing --tar FILE (a symlink there is replaced, never followed).
        #[arg(long)]
        force: bool,
    },
    /// Copy a directory's tree, or a tar archive's, into a store (created if missing) in one
    /// transaction.
    #[command(allow_missing_positional = true)]
    Import {
        /// The directory to copy (or give --tar FILE instead).
        #[arg(required_unless_present = "tar", conflicts_with = "tar")]
        dir: Option<PathBuf>,
        /// A store file or a mountpoint.
        store: PathBuf,
        /// Where in the store to put it.
        #[arg(long, default_value = "/")]
        into: String,
        /// Fail instead of skipping names, symlinks or files the store refuses.
        #[arg(long)]
        strict: bool,
        #[arg(long)]
        json: bool,
        /// Copy the files and directories of this tar archive instead of a directory.
        #[arg(long, value_name = "FILE")]
        tar: Option<PathBuf>,
    },
    /// List a directory of a store (mounted or not).
    Ls {
        store: PathBuf,
        #[arg(default_value = "/")]
        path: String,
        /// Long listing: mode, size, modification time.
        #[arg(short = 'l')]
        long: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print a file of a store (mounted or not).
    Cat {
        store: PathBuf,
        path: String,
        /// `{"content": ...}` (or `content_hex` for bytes that are not UTF-8).
        #[arg(long)]
        json: bool,
    },
    /// Print the tree under a path of a store.
    Tree {
        store: PathBuf,
        #[arg(default_value = "/")]
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Files, directories and content bytes under a path of a store.
    Du {
        store: PathBuf,
        #[arg(default_value = "/")]
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Counts, largest files, store file size and last commit time.
    Stats {
        store: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Remove memory files neither read nor written since a time (through the mount when mounted).
    Expire {
        store: PathBuf,
        /// e.g. 30d, 12h, 2w.
        #[arg(long, conflicts_with = "before", required_unless_present = "before")]
        unused_for: Option<String>,
        /// e.g. 2026-01-31 or 2026-01-31T08:00:00Z (UTC).
        #[arg(long)]
        before: Option<String>,
        /// Only the files under this path.
        #[arg(long, default_value = "/")]
        path: String,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Rewrite a store file (not mounted) to give free space back to the disk.
    Compact { store: PathBuf },
    /// History records, newest first, for the store or one path (following renames).
    Log {
        store: PathBuf,
        path: Option<String>,
        /// Only records since then: a date, `2h` (ago), a seq or a mark.
        #[arg(long)]
        since: Option<String>,
        /// At most this many records.
        #[arg(short = 'n', long)]
        limit: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Print a file as it was at a point of history (a seq, a mark, a date or `2h` ago).
    Show {
        store: PathBuf,
        path: String,
        #[arg(long)]
        at: String,
    },
    /// A unified diff of a file between two points of history (`--to` defaults to now).
    Diff {
        store: PathBuf,
        path: String,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: Option<String>,
    },
    /// Label the current point of history.
    Mark { store: PathBuf, name: String },
    /// Bring one file or directory back to a point of history, in one new transaction.
    Revert {
        store: PathBuf,
        path: String,
        #[arg(long)]
        to: String,
    },
    /// Bring the whole store back to a point of history, in one new transaction (undoable).
    Rollback {
        store: PathBuf,
        #[arg(long)]
        to: String,
    },
    /// Erase the content of past versions of a file (all, or the one seen at --at), keeping the
    /// records that they existed. The bytes leave the store file at the next `compact`.
    Redact {
        store: PathBuf,
        path: String,
        #[arg(long)]
        at: Option<String>,
    },
}

/// Parses a retention such as `30d`, `12h` or `0` (off) into nanoseconds.
fn parse_keep(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    tools::parse_duration(s).map(|ns| ns as u64)
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
            // Mode 0600 when created; a symlink planted at the log's name is never followed.
            let f = crate::private::open_append(p)
                .map_err(|e| format!("log file {}", crate::private::describe(p, e)))?;
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

pub fn main() -> i32 {
    // Nothing redbfs creates is for group or others, whatever umask it was started with: the
    // files have explicit modes, and this covers the directories (scratch copies, a new
    // mountpoint, an export's parents).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    nix::sys::stat::umask(old | nix::sys::stat::Mode::from_bits_truncate(0o077));
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
            max_buffer,
            quota,
            max_files,
            max_path_bytes,
            max_depth,
            names,
            lost_updates,
            keep_history,
            notify_fd,
        } => {
            let daemon = foreground || notify_fd.is_some();
            let store_path = store
                .clone()
                .unwrap_or_else(|| mount::default_store(&mountpoint));
            let background_log = log_file.clone().unwrap_or_else(|| {
                let mut p = store_path.clone().into_os_string();
                p.push(".log");
                PathBuf::from(p)
            });
            let mut created = mount::Created::default();
            if daemon {
                let log = match (&log_file, notify_fd) {
                    (Some(p), _) => Some(p.clone()),
                    (None, Some(_)) => Some(background_log.clone()),
                    (None, None) => None,
                };
                // Until the mount answers, a failure is reported on the notify descriptor and
                // what this attempt created (the log, the store's directory) is removed.
                let started = (|| -> Result<(), String> {
                    if log_file.is_none()
                        && let Some(p) = log.as_deref()
                    {
                        // The log goes beside the store, whose directory the mount creates.
                        let dir = crate::private::parent_dir(p);
                        created
                            .create_dir_all(&dir)
                            .map_err(|e| format!("{}: {e}", dir.display()))?;
                    }
                    let new_log = log
                        .as_deref()
                        .filter(|p| std::fs::symlink_metadata(p).is_err());
                    init_logging(verbose, log.as_deref())?;
                    if let Some(p) = new_log {
                        created.record(p);
                    }
                    Ok(())
                })();
                if let Err(e) = started {
                    mount::startup_failed(notify_fd, &e, &mut created);
                    return Err(e);
                }
            } else {
                // The daemon started below logs there: refuse here, where the reason can be
                // printed, what it would refuse (a symlink at the log's name).
                crate::private::check_store_dir(&store_path)?;
                if std::fs::symlink_metadata(&background_log).is_ok_and(|m| m.is_symlink()) {
                    let e = std::io::Error::from_raw_os_error(libc::ELOOP);
                    return Err(format!(
                        "log file {}",
                        crate::private::describe(&background_log, e)
                    ));
                }
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
                    max_buffer_bytes: max_buffer,
                    quota_bytes: quota,
                    max_files,
                    max_path_bytes,
                    max_depth,
                    names: names.map(|n| match n {
                        Names::Linux => NameRules::Linux,
                        Names::Portable => NameRules::Portable,
                    }),
                    lost_updates: lost_updates.map(|l| match l {
                        LostUpdatesArg::Record => LostUpdates::Record,
                        LostUpdatesArg::Refuse => LostUpdates::Refuse,
                        LostUpdatesArg::Off => LostUpdates::Off,
                    }),
                },
                argv,
                notify_fd,
                keep_history,
                created,
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
            let t = Target::resolve(&target)?;
            let (store, mounted) = (t.store, t.mountpoint.is_some());
            let v = if mounted {
                control::Client::connect(&store)
                    .map_err(|e| format!("{}: the daemon does not answer: {e}", store.display()))?
                    .call(&json!({"op": "status"}))?
            } else {
                let s = ReadOnlyStore::open(&store).map_err(|e| e.to_string())?;
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
                    println!(
                        "log:        {} bytes since the last checkpoint (commit {})",
                        v["log_bytes"], v["commits"]
                    );
                    println!(
                        "conflicts:  {} since mount (--lost-updates {})",
                        v["conflicts"],
                        v["limits"]["lost_updates"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(0)
        }
        Cmd::Check {
            target,
            repair,
            json,
        } => {
            let t = Target::resolve(&target)?;
            if repair {
                t.refuse_mounted("repair")?;
                let s = Store::open_existing(&t.store).map_err(|e| e.to_string())?;
                for f in tools::repair(&s)? {
                    eprintln!("repaired: {f}");
                }
            }
            let mut findings = Vec::new();
            if t.mountpoint.is_none() {
                // On a private copy: redb's check may repair what it checks.
                let mut s = ReadOnlyStore::open(&t.store).map_err(|e| e.to_string())?;
                match s.check_integrity() {
                    Ok(true) => {}
                    Ok(false) => {
                        findings.push("redb integrity check repaired the file".to_string())
                    }
                    Err(e) => findings.push(format!("redb integrity check failed: {e}")),
                }
            }
            let v = t.ask(json!({"op": "check"}))?;
            findings.extend(
                v["findings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.as_str().map(str::to_string)),
            );
            if json {
                println!(
                    "{}",
                    json!({"ok": findings.is_empty(), "findings": findings})
                );
            } else if findings.is_empty() {
                let how = if t.mountpoint.is_some() {
                    "invariants hold (live check through the daemon; unmount for redb's page check too)"
                } else {
                    "clean"
                };
                println!("{}: {how}", t.store.display());
            } else {
                for f in &findings {
                    println!("{f}");
                }
            }
            Ok(if findings.is_empty() { 0 } else { 1 })
        }
        Cmd::Snapshot {
            source,
            out,
            at,
            json,
        } => {
            let t = Target::resolve(&source)?;
            let to_stdout = out.as_os_str() == "-";
            let dest = if to_stdout {
                let mut p = t.store.clone().into_os_string();
                p.push(format!(".stdout-snapshot-{}", std::process::id()));
                PathBuf::from(p)
            } else {
                mount::absolute(&out)?
            };
            let v = if let Some(at) = &at {
                t.change(json!({"op": "snapshot_at", "out": dest, "at": at}))?["snapshot"].clone()
            } else if t.mountpoint.is_some() {
                t.ask(json!({"op": "snapshot", "out": dest}))?["snapshot"].clone()
            } else {
                let s = ReadOnlyStore::open(&t.store).map_err(|e| e.to_string())?;
                let r = s.read().map_err(|e| e.to_string())?;
                {
                    let mut progress = Progress::new("snapshot");
                    let info = tools::snapshot(&r, &dest, &mut |n| progress.update(n));
                    progress.finish();
                    serde_json::to_value(info?).map_err(|e| e.to_string())?
                }
            };
            if to_stdout {
                let copied = crate::private::open_read(&dest)
                    .and_then(|mut f| std::io::copy(&mut f, &mut std::io::stdout().lock()));
                let _ = std::fs::remove_file(&dest);
                copied.map_err(|e| format!("writing the snapshot to stdout: {e}"))?;
            }
            if json {
                eprintln!("{v}");
            } else {
                eprintln!(
                    "snapshot {}: {} entries, {} bytes, {:.3} s",
                    if to_stdout {
                        "-".to_string()
                    } else {
                        dest.display().to_string()
                    },
                    v["entries"],
                    v["file_bytes"],
                    v["seconds"].as_f64().unwrap_or(0.0)
                );
            }
            Ok(0)
        }
        Cmd::Restore {
            snapshot,
            store,
            discard_current,
        } => {
            let store = mount::absolute(&store)?;
            if let Some(mp) = mount::mountpoint_of_store(&store) {
                return Err(format!(
                    "{} is mounted at {}; unmount it before restoring",
                    store.display(),
                    mp.display()
                ));
            }
            let kept = tools::restore(&snapshot, &store, discard_current)?;
            match kept {
                Some(k) => eprintln!(
                    "restored {}; the previous store is kept as {}",
                    store.display(),
                    k.display()
                ),
                None => eprintln!("restored {}", store.display()),
            }
            Ok(0)
        }
        Cmd::Export {
            store,
            dir,
            tar,
            path,
            same_owner,
            force,
        } => {
            let opts = tools::ExportOptions { same_owner };
            let t = Target::resolve(&store)?;
            let report = t.with_snapshot(|r| match (&dir, &tar) {
                (Some(d), None) => {
                    let mut progress = Progress::new("export");
                    let report = tools::export_dir(r, &path, d, opts, &mut |n| progress.update(n));
                    progress.finish();
                    report
                }
                (None, Some(f)) if f.as_os_str() == "-" => tools::export_tar(
                    r,
                    &path,
                    &mut std::io::BufWriter::new(std::io::stdout().lock()),
                ),
                (None, Some(f)) => {
                    refuse_overwriting_a_store(f, &t.store)?;
                    let file = crate::private::create_output(f, force)?;
                    let made = file.metadata().map_err(|e| e.to_string())?;
                    let mut w = std::io::BufWriter::new(file);
                    let written = tools::export_tar(r, &path, &mut w).and_then(|rep| {
                        w.into_inner()
                            .map_err(|e| e.to_string())?
                            .sync_all()
                            .map_err(|e| e.to_string())?;
                        Ok(rep)
                    });
                    if written.is_err() {
                        // Nothing is left of a failed export: the file it made goes.
                        remove_if_same(f, &made);
                    }
                    written
                }
                _ => Err("give either DIR or --tar FILE".to_string()),
            })?;
            eprintln!(
                "exported {} files, {} directories, {} bytes",
                report.files, report.dirs, report.bytes
            );
            Ok(0)
        }
        Cmd::Import {
            dir,
            store,
            into,
            strict,
            json,
            tar,
        } => {
            let (key, dir) = match (&dir, &tar) {
                (_, Some(t)) => ("tar", mount::absolute(t)?),
                (Some(d), None) => ("dir", mount::absolute(d)?),
                (None, None) => return Err("give DIR or --tar FILE".into()),
            };
            if tar.is_none() && !dir.is_dir() {
                return Err(format!("{}: not a directory", dir.display()));
            }
            let abs = mount::absolute(&store)?;
            let report =
                match Target::resolve(&abs) {
                    Ok(t) if t.mountpoint.is_some() => t
                        .ask(json!({"op": "import", key: dir, "into": into, "strict": strict}))?
                        ["import"]
                        .clone(),
                    _ => {
                        let owner = (
                            nix::unistd::getuid().as_raw(),
                            nix::unistd::getgid().as_raw(),
                        );
                        let existed = std::fs::symlink_metadata(&abs).is_ok();
                        let s = Store::open_or_create(&abs, owner).map_err(|e| e.to_string())?;
                        let made = std::fs::symlink_metadata(&abs).map_err(|e| e.to_string())?;
                        let limits = crate::fs::Limits::stored(&s);
                        let mut progress = Progress::new("import");
                        let import = if tar.is_some() {
                            tools::import_tar
                        } else {
                            tools::import
                        };
                        let report = import(&s, &limits, &dir, &into, strict, &mut |n| {
                            progress.update(n)
                        });
                        progress.finish();
                        if report.is_err() && !existed {
                            // A store this import made, and failed to fill, does not stay.
                            drop(s);
                            remove_if_same(&abs, &made);
                        }
                        serde_json::to_value(report?).map_err(|e| e.to_string())?
                    }
                };
            if json {
                println!("{report}");
            } else {
                for s in report["skipped"].as_array().into_iter().flatten() {
                    eprintln!(
                        "skipped {}: {}",
                        s[0].as_str().unwrap_or(""),
                        s[1].as_str().unwrap_or("")
                    );
                }
                eprintln!(
                    "imported {} files, {} directories, {} bytes",
                    report["files"], report["dirs"], report["bytes"]
                );
            }
            Ok(0)
        }
        Cmd::Ls {
            store,
            path,
            long,
            json,
        } => {
            let v = Target::resolve(&store)?.ask(json!({"op": "ls", "path": path}))?;
            if json {
                println!("{}", v["entries"]);
                return Ok(0);
            }
            for e in v["entries"].as_array().into_iter().flatten() {
                let name = e["name"].as_str().unwrap_or("");
                if long {
                    println!(
                        "{} {:>10} {} {}",
                        mode_string(
                            e["kind"].as_str() == Some("dir"),
                            e["mode"].as_u64().unwrap_or(0) as u32
                        ),
                        e["size"],
                        fmt_time(e["mtime_ns"].as_i64().unwrap_or(0)),
                        name
                    );
                } else {
                    println!("{name}");
                }
            }
            Ok(0)
        }
        Cmd::Cat { store, path, json } => {
            let mut v = Target::resolve(&store)?.ask(json!({"op": "cat", "path": path}))?;
            if json {
                if let Some(o) = v.as_object_mut() {
                    o.remove("ok");
                }
                println!("{v}");
                return Ok(0);
            }
            std::io::stdout()
                .write_all(&tools::content_of(&v))
                .map_err(|e| e.to_string())?;
            Ok(0)
        }
        Cmd::Tree { store, path, json } => {
            let v = Target::resolve(&store)?.ask(json!({"op": "tree", "path": path}))?;
            if json {
                println!("{}", v["tree"]);
                return Ok(0);
            }
            for item in v["tree"].as_array().into_iter().flatten() {
                let depth = item["depth"].as_u64().unwrap_or(0) as usize;
                let e = &item["entry"];
                let slash = if e["kind"].as_str() == Some("dir") && e["name"] != "/" {
                    "/"
                } else {
                    ""
                };
                println!(
                    "{}{}{slash}",
                    "  ".repeat(depth),
                    e["name"].as_str().unwrap_or("")
                );
            }
            Ok(0)
        }
        Cmd::Du { store, path, json } => {
            let v = Target::resolve(&store)?.ask(json!({"op": "du", "path": path}))?;
            let d = &v["du"];
            if json {
                println!("{d}");
            } else {
                println!(
                    "{}\t{path}\t({} files, {} directories)",
                    d["bytes"], d["files"], d["dirs"]
                );
            }
            Ok(0)
        }
        Cmd::Stats { store, json } => {
            let t = Target::resolve(&store)?;
            let v = t.ask(json!({"op": "stats"}))?;
            let s = &v["stats"];
            if json {
                println!("{s}");
                return Ok(0);
            }
            println!("store:        {}", t.store.display());
            println!(
                "mounted at:   {}",
                t.mountpoint
                    .as_ref()
                    .map_or("(not mounted)".to_string(), |m| m.display().to_string())
            );
            println!("files:        {}", s["files"]);
            println!("directories:  {}", s["dirs"]);
            println!("content:      {} bytes", s["content_bytes"]);
            println!("store file:   {} bytes", s["store_bytes"]);
            println!(
                "last commit:  {}",
                s["last_commit_ns"]
                    .as_i64()
                    .map_or("never".into(), fmt_time)
            );
            println!("largest files:");
            for f in s["largest"].as_array().into_iter().flatten() {
                println!("  {:>12}  {}", f[1], f[0].as_str().unwrap_or(""));
            }
            Ok(0)
        }
        Cmd::Expire {
            store,
            unused_for,
            before,
            path,
            dry_run,
            json,
        } => {
            let t = Target::resolve(&store)?;
            let cutoff = match (&unused_for, &before) {
                (Some(d), _) => crate::store::now_ns() - tools::parse_duration(d)?,
                (None, Some(d)) => tools::parse_date(d)?,
                (None, None) => return Err("give --unused-for or --before".into()),
            };
            let v = t.ask(json!({"op": "unused", "path": path, "cutoff_ns": cutoff}))?;
            let files: Vec<(String, i64)> =
                serde_json::from_value(v["files"].clone()).map_err(|e| e.to_string())?;
            if !dry_run {
                match &t.mountpoint {
                    // Through the mount, so the kernel's caches stay true.
                    Some(mp) => {
                        let mut progress = Progress::new("expire");
                        for (i, (p, _)) in files.iter().enumerate() {
                            let full = mp.join(p.trim_start_matches('/'));
                            std::fs::remove_file(&full)
                                .map_err(|e| format!("{}: {e}", full.display()))?;
                            progress.update(i as u64 + 1);
                        }
                        progress.finish();
                    }
                    None => {
                        let s = Store::open_existing(&t.store).map_err(|e| e.to_string())?;
                        let paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
                        tools::remove_files(&s, &paths)?;
                    }
                }
            }
            if json {
                println!("{}", json!({"dry_run": dry_run, "removed": files}));
            } else {
                let verb = if dry_run { "would remove" } else { "removed" };
                for (p, last) in &files {
                    println!("{verb} {p} (last used {})", fmt_time(*last));
                }
                eprintln!("{verb} {} files", files.len());
            }
            Ok(0)
        }
        Cmd::Compact { store } => {
            let t = Target::resolve(&store)?;
            t.refuse_mounted("compact")?;
            let before = std::fs::metadata(&t.store).map(|m| m.len()).unwrap_or(0);
            let mut s = Store::open_existing(&t.store).map_err(|e| e.to_string())?;
            s.compact().map_err(|e| e.to_string())?;
            drop(s);
            let after = std::fs::metadata(&t.store).map(|m| m.len()).unwrap_or(0);
            eprintln!("compacted {}: {before} -> {after} bytes", t.store.display());
            Ok(0)
        }
        Cmd::Log {
            store,
            path,
            since,
            limit,
            json,
        } => {
            let v = Target::resolve(&store)?
                .ask(json!({"op": "log", "path": path, "since": since, "limit": limit}))?;
            if json {
                println!("{}", v["records"]);
                return Ok(0);
            }
            for r in v["records"].as_array().into_iter().flatten() {
                let paths: Vec<&str> = r["paths"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.as_str())
                    .collect();
                println!(
                    "@{:<6} {}  {:<9} {:<40} {:>8} -> {:<8} uid {} pid {} {}{}",
                    r["seq"],
                    fmt_time(r["time"].as_i64().unwrap_or(0)),
                    r["op"].as_str().unwrap_or(""),
                    paths.join(" -> "),
                    r["size_before"],
                    r["size_after"],
                    r["uid"],
                    r["pid"],
                    r["comm"].as_str().unwrap_or(""),
                    if r["redacted"] == true {
                        "  [redacted]"
                    } else {
                        ""
                    }
                );
                if let Some(c) = r["conflict"].as_str() {
                    println!("        {c}");
                }
            }
            Ok(0)
        }
        Cmd::Show { store, path, at } => {
            let v = Target::resolve(&store)?.ask(json!({"op": "show", "path": path, "at": at}))?;
            std::io::stdout()
                .write_all(&tools::content_of(&v))
                .map_err(|e| e.to_string())?;
            Ok(0)
        }
        Cmd::Diff {
            store,
            path,
            from,
            to,
        } => {
            let v = Target::resolve(&store)?
                .ask(json!({"op": "diff", "path": path, "from": from, "to": to}))?;
            let d = v["diff"].as_str().unwrap_or("");
            print!("{d}");
            Ok(if d.is_empty() { 0 } else { 1 })
        }
        Cmd::Mark { store, name } => {
            let v = Target::resolve(&store)?.change(json!({"op": "mark", "name": name}))?;
            eprintln!("marked @{} as {name}", v["seq"]);
            Ok(0)
        }
        Cmd::Revert { store, path, to } => {
            let v =
                Target::resolve(&store)?.change(json!({"op": "revert", "path": path, "to": to}))?;
            eprintln!("reverted {path} to @{}", v["to"]);
            Ok(0)
        }
        Cmd::Rollback { store, to } => {
            let v = Target::resolve(&store)?.change(json!({"op": "rollback", "to": to}))?;
            eprintln!(
                "rolled back to @{} ({} records undone)",
                v["to"], v["undone"]
            );
            Ok(0)
        }
        Cmd::Redact { store, path, at } => {
            let v =
                Target::resolve(&store)?.change(json!({"op": "redact", "path": path, "at": at}))?;
            eprintln!(
                "erased {} content chunks of past versions of {path}; run `redbfs compact` on the unmounted store to drop the bytes from the file",
                v["erased_chunks"]
            );
            Ok(0)
        }
    }
}

/// Refuses an output file that is a store, a write-ahead log, or a file kept beside the store
/// being read (its log, its socket), whatever `--force` says: same device and inode, or a
/// store's magic number.
fn refuse_overwriting_a_store(out: &Path, store: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(out) else {
        return Ok(());
    };
    let beside = |suffix: &str| {
        let mut p = store.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let kept = [
        store.to_path_buf(),
        crate::store::wal::path_of(store),
        beside(".log"),
        beside(".sock"),
    ];
    let same = kept
        .iter()
        .any(|k| std::fs::metadata(k).is_ok_and(|k| k.dev() == m.dev() && k.ino() == m.ino()));
    if same || crate::store::is_store_file(out) {
        return Err(format!(
            "{}: is a store or a file redbfs keeps beside one; export never writes over it \
             (give another name)",
            out.display()
        ));
    }
    Ok(())
}

/// Removes `path` if it is still the file described by `made`.
fn remove_if_same(path: &Path, made: &std::fs::Metadata) {
    use std::os::unix::fs::MetadataExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == made.dev() && m.ino() == made.ino())
    {
        let _ = std::fs::remove_file(path);
    }
}

/// A store named on the command line, and where it is mounted if it is.
struct Target {
    store: PathBuf,
    mountpoint: Option<PathBuf>,
}

impl Target {
    fn resolve(target: &Path) -> Result<Target, String> {
        let abs = mount::absolute(target)?;
        if let Some(store) = mount::redbfs_mount_at(&abs) {
            return Ok(Target {
                store,
                mountpoint: Some(abs),
            });
        }
        if abs.is_file() {
            let mountpoint = mount::mountpoint_of_store(&abs);
            return Ok(Target {
                store: abs,
                mountpoint,
            });
        }
        Err(format!(
            "{}: neither a store file nor a redbfs mountpoint",
            target.display()
        ))
    }

    fn refuse_mounted(&self, what: &str) -> Result<(), String> {
        match &self.mountpoint {
            Some(mp) => Err(format!(
                "{} is mounted at {}; unmount it before {what}",
                self.store.display(),
                mp.display()
            )),
            None => Ok(()),
        }
    }

    /// A read-only query: through the daemon when mounted, on the file otherwise.
    fn ask(&self, req: serde_json::Value) -> Result<serde_json::Value, String> {
        if self.mountpoint.is_some() {
            return control::Client::connect(&self.store)
                .map_err(|e| format!("{}: the daemon does not answer: {e}", self.store.display()))?
                .call(&req);
        }
        let s = ReadOnlyStore::open(&self.store).map_err(|e| e.to_string())?;
        let r = s.read().map_err(|e| e.to_string())?;
        tools::query(&r, s.file_bytes(), &req)
    }

    /// A history change: through the daemon when mounted, on the file otherwise.
    fn change(&self, mut req: serde_json::Value) -> Result<serde_json::Value, String> {
        req["uid"] = json!(nix::unistd::getuid().as_raw());
        req["gid"] = json!(nix::unistd::getgid().as_raw());
        req["pid"] = json!(std::process::id());
        if self.mountpoint.is_some() {
            return control::Client::connect(&self.store)
                .map_err(|e| format!("{}: the daemon does not answer: {e}", self.store.display()))?
                .call(&req);
        }
        let s = Store::open_existing(&self.store).map_err(|e| e.to_string())?;
        let limits = crate::fs::Limits::stored(&s);
        let fs = crate::fs::Fs::new(s, limits).map_err(|e| e.to_string())?;
        tools::history_change(&fs, &req)
    }

    /// Runs `f` on a consistent view: a snapshot taken through the daemon when mounted.
    fn with_snapshot<T>(
        &self,
        f: impl FnOnce(&crate::store::ReadTxn) -> Result<T, String>,
    ) -> Result<T, String> {
        if self.mountpoint.is_none() {
            let s = ReadOnlyStore::open(&self.store).map_err(|e| e.to_string())?;
            let r = s.read().map_err(|e| e.to_string())?;
            return f(&r);
        }
        let dir = tempfile::Builder::new()
            .prefix("redbfs-export-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let snap = dir.path().join("snapshot.redb");
        self.ask(json!({"op": "snapshot", "out": snap}))?;
        let s = ReadOnlyStore::open(&snap).map_err(|e| e.to_string())?;
        let r = s.read().map_err(|e| e.to_string())?;
        f(&r)
    }
}

/// `drwx------`-style permissions.
fn mode_string(dir: bool, mode: u32) -> String {
    let mut s = String::from(if dir { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
fn fmt_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A progress line on stderr for long operations, only when stderr is a terminal.
struct Progress {
    what: &'static str,
    tty: bool,
    last: std::time::Instant,
}

impl Progress {
    fn new(what: &'static str) -> Progress {
        // SAFETY: isatty on a valid descriptor number has no preconditions.
        let tty = unsafe { libc::isatty(2) } == 1;
        Progress {
            what,
            tty,
            last: std::time::Instant::now(),
        }
    }

    fn update(&mut self, done: u64) {
        if self.tty && self.last.elapsed().as_millis() >= 100 {
            self.last = std::time::Instant::now();
            eprint!("\r{}: {done} records", self.what);
        }
    }

    fn finish(&self) {
        if self.tty {
            eprint!("\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fmt_time, mode_string, parse_size};

    #[test]
    fn times_and_modes() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00");
        assert_eq!(
            fmt_time(1_795_955_400 * 1_000_000_000),
            "2026-11-29 12:30:00"
        );
        assert_eq!(mode_string(true, 0o700), "drwx------");
        assert_eq!(mode_string(false, 0o644), "-rw-r--r--");
    }

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
