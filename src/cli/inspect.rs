//! Status and inspection: `status`, `ls`, `cat`, `tree`, `du`, `stats`, `quota` and `check`
//! (with its `--repair`). All read a store, mounted or not, without changing it (but for
//! `--repair` and setting a quota).

use std::path::Path;

use serde_json::json;

use super::args::{Cat, Check, Du, Ls, Quota, Stats, Status, Tree};
use super::output::{self, Format, Listing, ListingWriter};
use super::target::Target;
use crate::store::ReadOnlyStore;

pub(super) fn status(a: Status) -> Result<i32, String> {
    let t = Target::resolve(&a.target)?;
    let v = t.run(json!({"op": "status"}), |_| {
        t.read(|s, r| {
            let u = r.usage().map_err(|e| e.to_string())?;
            // An unmounted store is read as it is (an older format from a migrated private
            // copy): it keeps its number until a mount migrates it.
            let format = s.file_format().map_err(|e| e.to_string())?;
            Ok(json!({"ok": true, "mountpoint": null, "store": t.store,
                      "format": format, "files": u.files, "dirs": u.dirs,
                      "content_bytes": u.content_bytes, "store_bytes": s.file_bytes(),
                      "replica_urls": crate::replica::config::stored_urls(r)}))
        })
    })?;
    output::status(&v, Format::of(a.json));
    Ok(0)
}

/// `ls` and `tree` print each entry as it comes (streamed by the daemon of a mounted store);
/// `--json` writes its array an entry at a time too.
pub(super) fn ls(a: Ls) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let mut out = ListingWriter::new(Listing::Ls { long: a.long }, Format::of(a.json));
    t.listing(json!({"op": "ls", "path": a.path}), &mut |e| {
        out.entry(&e);
        Ok(())
    })?;
    out.finish();
    Ok(0)
}

/// The bytes go out as they are read; `--json` holds them until the last is read, since only
/// then is it known whether they are UTF-8 (a string) or not (hex).
pub(super) fn cat(a: Cat) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let req = json!({"op": "cat", "path": a.path});
    if Format::of(a.json) == Format::Json {
        let mut all = Vec::new();
        t.content(req, &mut |piece| {
            all.extend_from_slice(piece);
            Ok(())
        })?;
        output::cat_json(all);
    } else {
        t.content(req, &mut output::data)?;
    }
    Ok(0)
}

pub(super) fn tree(a: Tree) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let mut out = ListingWriter::new(Listing::Tree, Format::of(a.json));
    t.listing(json!({"op": "tree", "path": a.path}), &mut |e| {
        out.entry(&e);
        Ok(())
    })?;
    out.finish();
    Ok(0)
}

pub(super) fn du(a: Du) -> Result<i32, String> {
    let v = Target::resolve(&a.store)?.ask(json!({"op": "du", "path": a.path}))?;
    output::du(&v, &a.path, Format::of(a.json));
    Ok(0)
}

/// `quota STORE` lists; `quota STORE PATH --bytes/--files` sets; `--clear` removes. Setting
/// keeps the limit not given; setting on a store not mounted opens it for writing.
pub(super) fn quota(a: Quota) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let f = Format::of(a.json);
    let Some(path) = a.path else {
        let v = t.ask(json!({"op": "quotas"}))?;
        output::quotas(&v["quotas"], f);
        return Ok(0);
    };
    let current = t.ask(json!({"op": "du", "path": path}))?;
    let (bytes, files) = if a.clear {
        (0, 0)
    } else if a.bytes.is_none() && a.files.is_none() {
        // No limit given: this directory's usage and quota.
        output::du(&current, &path, f);
        return Ok(0);
    } else {
        let keep = |k: &str| current["du"][k].as_u64().unwrap_or(0);
        (
            a.bytes.unwrap_or_else(|| keep("quota_bytes")),
            a.files.unwrap_or_else(|| keep("quota_files")),
        )
    };
    let v = t.change(json!({"op": "quota", "path": path, "bytes": bytes, "files": files}))?;
    output::quota_set(&v["quota"], f);
    Ok(0)
}

pub(super) fn stats(a: Stats) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    let v = t.ask(json!({"op": "stats"}))?;
    output::stats(&t.store, t.mountpoint.as_deref(), &v, Format::of(a.json));
    Ok(0)
}

/// Exit 1 on findings. An unmounted store also gets redb's own page check.
pub(super) fn check(a: Check) -> Result<i32, String> {
    let t = Target::resolve(&a.target)?;
    if a.repair {
        t.refuse_mounted("repair")?;
        output::repaired(&crate::tools::repair(&t.open_existing()?)?);
    }
    let mut findings = Vec::new();
    if t.is_mounted() {
        let v = t.ask(json!({"op": "check"}))?;
        findings.extend(
            v["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(str::to_string)),
        );
    } else {
        findings = check_file(&t.store)?;
    }
    output::check(&t.store, t.is_mounted(), &findings, Format::of(a.json));
    Ok(if findings.is_empty() { 0 } else { 1 })
}

/// `check` of an unmounted store: redb's integrity check, then the invariants read through
/// the same opening (its cache holds the file the integrity check read), so the file is read
/// once; on a private copy when the store needs recovery (redb's check may repair what it
/// checks, and the copy is what is read).
fn check_file(store: &Path) -> Result<Vec<String>, String> {
    let e = |e: crate::store::StoreError| e.to_string();
    let mut s = ReadOnlyStore::open(store).map_err(e)?;
    let mut findings = Vec::new();
    let integrity = |clean: Result<bool, crate::store::StoreError>, f: &mut Vec<String>| match clean
    {
        Ok(true) => {}
        Ok(false) => f.push("redb integrity check repaired the file".to_string()),
        Err(e) => f.push(format!("redb integrity check failed: {e}")),
    };
    if s.is_private_copy() {
        integrity(s.check_integrity(), &mut findings);
        findings.extend(crate::check::invariants(&s.read().map_err(e)?).map_err(e)?);
        return Ok(findings);
    }
    match crate::store::check_integrity_then_read(store) {
        Ok(checked) if checked.clean => {
            findings.extend(crate::check::invariants(&checked.read().map_err(e)?).map_err(e)?);
        }
        // The invariants of the file as it is (not as redb repaired it in memory), read
        // through the read-only opening.
        Ok(_) => {
            integrity(Ok(false), &mut findings);
            findings.extend(crate::check::invariants(&s.read().map_err(e)?).map_err(e)?);
        }
        Err(err) => {
            integrity(Err(err), &mut findings);
            findings.extend(crate::check::invariants(&s.read().map_err(e)?).map_err(e)?);
        }
    }
    Ok(findings)
}
