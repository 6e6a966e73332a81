//! Backup and transfer: `snapshot`, `restore`, `export` and `import`. None of them writes
//! over a store or leaves a half-made output behind.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::args::{Export, Import, Restore, Snapshot};
use super::output::{self, Format, Progress};
use super::target::Target;
use super::time;
use crate::mount;
use crate::store::{ReadTxn, Store};
use crate::tools;

pub(super) fn snapshot(a: Snapshot) -> Result<i32, String> {
    let f = Format::of(a.json);
    let t = Target::resolve(&a.source)?;
    let to_stdout = a.out.as_os_str() == "-";
    let dest = if to_stdout {
        let mut p = t.store.clone().into_os_string();
        p.push(format!(".stdout-snapshot-{}", std::process::id()));
        PathBuf::from(p)
    } else {
        mount::absolute(&a.out)?
    };
    let v = match &a.at {
        Some(at) => t.change(
            json!({"op": "snapshot_at", "out": dest, "at": time::point(at),
                                    "subtree": a.path}),
        )?,
        None => t.run(
            json!({"op": "snapshot", "out": dest, "path": a.path}),
            |_| {
                t.read(|_, r| {
                    let progress = Progress::new("snapshot", f);
                    let info = match &a.path {
                        Some(p) => {
                            tools::snapshot_subtree(r, p, &dest, &mut |n| progress.update(n))?
                        }
                        None => tools::snapshot(r, &dest, &mut |n| progress.update(n))?,
                    };
                    Ok(json!({"snapshot": info}))
                })
            },
        )?,
    };
    if to_stdout {
        let copied = crate::private::open_read(&dest).and_then(|mut f| {
            std::io::copy(&mut f, &mut output::Stdout)?;
            std::io::Write::flush(&mut output::Stdout)
        });
        let _ = std::fs::remove_file(&dest);
        copied.map_err(|e| format!("writing the snapshot to stdout: {e}"))?;
    }
    let shown = if to_stdout {
        "-".to_string()
    } else {
        dest.display().to_string()
    };
    output::snapshot(&shown, &v["snapshot"], f);
    Ok(0)
}

pub(super) fn restore(a: Restore) -> Result<i32, String> {
    let [snapshot, store] = <[_; 2]>::try_from(a.paths)
        .map_err(|_| "restore SNAPSHOT STORE (or restore --from URL STORE)".to_string())?;
    let store = Target::unmounted(&store, "restoring")?;
    if let Some(name) = store.file_name().and_then(|n| n.to_str()) {
        let dir = crate::private::parent_dir(&store);
        crate::replica::restore::remove_leftovers(&dir, name);
    }
    let (kept, dropped) = tools::restore_dropping(&snapshot, &store, a.discard_current)?;
    output::restored(&store, kept.as_deref());
    let dropped: Vec<String> = dropped.iter().map(|u| crate::replica::redact(u)).collect();
    output::replicas_dropped(&dropped);
    Ok(0)
}

pub(super) fn export(a: Export) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let report = t.with_snapshot(|r| match (&a.dir, &a.tar) {
        (Some(d), None) => {
            let opts = tools::ExportOptions {
                same_owner: a.same_owner,
            };
            let progress = Progress::new("export", Format::Human);
            tools::export_dir(r, &a.path, d, opts, &mut |n| progress.update(n))
        }
        (None, Some(f)) if f.as_os_str() == "-" => {
            tools::export_tar(r, &a.path, &mut std::io::BufWriter::new(output::Stdout))
        }
        (None, Some(f)) => export_tar_file(r, &a.path, f, &t.store, a.force),
        _ => Err("give either DIR or --tar FILE".to_string()),
    })?;
    output::exported(report.files, report.dirs, report.bytes);
    Ok(0)
}

/// A tar file made here and synced; nothing is left of it if writing fails.
fn export_tar_file(
    r: &ReadTxn,
    path: &str,
    out: &Path,
    store: &Path,
    force: bool,
) -> Result<tools::ExportReport, String> {
    refuse_overwriting_a_store(out, store)?;
    let file = crate::private::create_output(out, force)?;
    let made = file.metadata().map_err(|e| e.to_string())?;
    let mut w = std::io::BufWriter::new(file);
    let written = tools::export_tar(r, path, &mut w).and_then(|rep| {
        w.into_inner()
            .map_err(|e| e.to_string())?
            .sync_all()
            .map_err(|e| e.to_string())?;
        Ok(rep)
    });
    if written.is_err() {
        // Nothing is left of a failed export: the file it made goes.
        remove_if_same(out, &made);
    }
    written
}

pub(super) fn import(a: Import) -> Result<i32, String> {
    let f = Format::of(a.json);
    let (key, src) = match (&a.dir, &a.tar) {
        (_, Some(t)) => ("tar", mount::absolute(t)?),
        (Some(d), None) => ("dir", mount::absolute(d)?),
        (None, None) => return Err("give DIR or --tar FILE".into()),
    };
    if a.tar.is_none() && !src.is_dir() {
        return Err(format!("{}: not a directory", src.display()));
    }
    let t = Target::resolve_or_new(&a.store)?;
    let req = json!({"op": "import", key: src, "into": a.into, "strict": a.strict});
    let v = t.run(req, |_| {
        let report = import_into_file(&t.store, &src, a.tar.is_some(), &a.into, a.strict, f)?;
        Ok(json!({"import": report}))
    })?;
    output::imported(&v["import"], f);
    Ok(0)
}

/// Imports into an unmounted store file, made if missing; a store this import made, and
/// failed to fill, does not stay.
fn import_into_file(
    store: &Path,
    src: &Path,
    tar: bool,
    into: &str,
    strict: bool,
    f: Format,
) -> Result<serde_json::Value, String> {
    let owner = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let existed = std::fs::symlink_metadata(store).is_ok();
    let mut s = Store::open_or_create(store, owner).map_err(|e| e.to_string())?;
    let before = s.file_bytes();
    let made = std::fs::symlink_metadata(store).map_err(|e| e.to_string())?;
    let limits = crate::fs::Limits::stored(&s);
    let progress = Progress::new("import", f);
    let import = if tar {
        tools::import_tar
    } else {
        tools::import
    };
    let report = import(&s, &limits, src, into, strict, &mut |n| progress.update(n));
    drop(progress);
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            drop(s);
            if !existed {
                remove_if_same(store, &made);
            }
            return Err(e);
        }
    };
    // One large transaction leaves the file with free pages (redb grows it in steps): a
    // store the import more than doubled is rewritten without them, which costs at most
    // twice what the import wrote.
    if s.file_bytes() > 2 * before {
        s.compact()
            .map_err(|e| format!("compacting after the import: {e}"))?;
    }
    serde_json::to_value(report).map_err(|e| e.to_string())
}

/// Refuses an output file that is a store, a write-ahead log, or a file kept beside the store
/// being read (its log and the log's previous file, its socket), whatever `--force` says: same
/// device and inode, or a store's magic number.
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
        crate::logfile::rotated(&beside(".log")),
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
