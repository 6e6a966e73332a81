//! The form mount(8) runs: `mount -t fuse.redbfs STORE MOUNTPOINT -o OPTIONS` (and an fstab
//! line of type `fuse.redbfs`) reaches mount.fuse3, which runs `redbfs STORE MOUNTPOINT -o
//! OPTIONS`. That form is turned into `redbfs mount MOUNTPOINT --store STORE ...` here, every
//! mount flag spelled as an option (`allow_other`, `ro`, `quota=1G`, `max_file_bytes=...`);
//! the options mount(8) itself passes are accepted and left to the kernel or ignored, and an
//! unknown option is refused by name.

use std::ffi::OsString;

/// Options mount(8), mount.fuse3 or systemd pass that redbfs has nothing to do with: the
/// kernel applies them, redbfs always mounts nosuid and nodev, or they concern mount(8).
const PASSED_BY_MOUNT: &[&str] = &[
    "rw",
    "defaults",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "async",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "dirsync",
    "default_permissions",
    "silent",
    "loud",
];

/// Mount flags that take a value, by their option name (`quota=1G` is `--quota 1G`).
const VALUED: &[&str] = &[
    "quota",
    "max_file_bytes",
    "max_buffer",
    "max_files",
    "max_path_bytes",
    "max_depth",
    "names",
    "lost_updates",
    "keep_history",
    "max_history_bytes",
    "replica",
    "replica_interval",
    "replica_snapshot_every",
    "replica_keep",
    "follow",
    "follow_interval",
    "threads",
    "log_file",
];

/// The arguments as clap reads them: the mount(8) form translated, anything else as it is.
pub(super) fn argv(args: Vec<OsString>, subcommands: &[String]) -> Result<Vec<OsString>, String> {
    let Some(first) = args.get(1).and_then(|a| a.to_str()) else {
        return Ok(args);
    };
    if first.starts_with('-') || subcommands.iter().any(|s| s == first) {
        return Ok(args);
    }
    let mut positional = Vec::new();
    let mut flags: Vec<OsString> = Vec::new();
    let mut rest = args.into_iter().skip(1);
    while let Some(a) = rest.next() {
        match a.to_str() {
            Some("-o") => {
                let opts = rest.next().ok_or("-o needs a list of options")?;
                flags.extend(options(opts.to_str().ok_or("-o: options are not UTF-8")?)?);
            }
            Some(o) if o.starts_with("-o") => flags.extend(options(&o[2..])?),
            // Flags after the two paths go through (the background daemon gets
            // --notify-fd when it is started again).
            _ if positional.len() == 2 => flags.push(a),
            _ => positional.push(a),
        }
    }
    let [store, mountpoint]: [OsString; 2] = positional.try_into().map_err(|_| {
        "mount form: redbfs STORE MOUNTPOINT [-o OPTIONS] (or a command: redbfs --help)".to_string()
    })?;
    let mut out: Vec<OsString> = vec!["redbfs".into(), "mount".into(), mountpoint];
    out.push("--store".into());
    out.push(store);
    out.extend(flags);
    Ok(out)
}

/// One `-o` list as flags of `redbfs mount`.
fn options(list: &str) -> Result<Vec<OsString>, String> {
    let mut flags = Vec::new();
    for opt in list.split(',').filter(|o| !o.is_empty()) {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        let flag = |n: &str| OsString::from(format!("--{}", n.replace('_', "-")));
        match (name, value) {
            ("ro", None) => flags.push("--read-only".into()),
            ("noexec", None) => flags.push("--noexec".into()),
            ("sync", None) => {
                return Err("mount option `sync` is not offered: a file's content is \
                            committed durably at close and fsync, never at each write \
                            (every change of names is durable before it returns, as \
                            `dirsync` asks)"
                    .into());
            }
            ("allow_other", None) => flags.push("--allow-other".into()),
            ("verbose", None) => flags.push("-v".into()),
            (n, Some(v)) if VALUED.contains(&n) => {
                flags.push(flag(n));
                flags.push(v.into());
            }
            (n, _) if PASSED_BY_MOUNT.contains(&n) => {}
            // systemd's own (x-systemd.automount ...) and comments for other tools.
            (n, _) if n.starts_with("x-") || n == "comment" => {}
            (n, _) if n == "fsname" || n == "subtype" => {}
            _ => {
                return Err(format!(
                    "unknown mount option `{opt}` (redbfs takes ro, allow_other, verbose, {})",
                    VALUED
                        .iter()
                        .map(|v| format!("{v}=..."))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Vec<String>, String> {
        let subs = vec!["mount".to_string(), "status".to_string()];
        argv(args.iter().map(OsString::from).collect(), &subs)
            .map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn the_mount_form_becomes_redbfs_mount() {
        assert_eq!(
            run(&["redbfs", "/s.redb", "/m", "-o", "rw,nosuid,nodev,_netdev,x-systemd.automount,quota=1G,lost_updates=refuse,ro,allow_other"]).unwrap(),
            [
                "redbfs", "mount", "/m", "--store", "/s.redb", "--quota", "1G",
                "--lost-updates", "refuse", "--read-only", "--allow-other"
            ]
        );
        // As the background daemon is started again: its extra flag goes through.
        assert_eq!(
            run(&[
                "redbfs",
                "/s.redb",
                "/m",
                "-omax_depth=4",
                "--notify-fd",
                "5"
            ])
            .unwrap(),
            [
                "redbfs",
                "mount",
                "/m",
                "--store",
                "/s.redb",
                "--max-depth",
                "4",
                "--notify-fd",
                "5"
            ]
        );
        // Commands are left alone.
        assert_eq!(
            run(&["redbfs", "status", "/m"]).unwrap(),
            ["redbfs", "status", "/m"]
        );
    }

    #[test]
    fn noexec_is_a_flag_and_sync_is_refused() {
        assert_eq!(
            run(&["redbfs", "/s.redb", "/m", "-o", "rw,noexec,dirsync"]).unwrap(),
            ["redbfs", "mount", "/m", "--store", "/s.redb", "--noexec"]
        );
        let e = run(&["redbfs", "/s.redb", "/m", "-o", "sync"]).unwrap_err();
        assert!(e.contains("`sync` is not offered"), "{e}");
    }

    #[test]
    fn an_unknown_option_is_refused_by_name() {
        let e = run(&["redbfs", "/s.redb", "/m", "-o", "rw,bogus=1"]).unwrap_err();
        assert!(e.contains("`bogus=1`"), "{e}");
        assert!(run(&["redbfs", "/s.redb"]).is_err());
    }
}
