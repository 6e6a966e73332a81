//! The command line's conventions: shell completions and man pages generated from the same
//! clap definitions as the parser (so each must name every command), `--version` naming the
//! store format this build reads, and a `.gitignore` that keeps what the README's first
//! command creates in the checkout out of `git status`.
//!
//! The man pages are checked with groff (`groff -man -ww -z`: every warning printed fails),
//! from the `groff-base` package, and the bash completions with `bash -n`; the test fails
//! loudly if either tool is missing.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{fuse_available, redbfs, redbfs_bin};

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The commands `redbfs --help` lists (less clap's `help`).
fn commands() -> Vec<String> {
    let help = stdout(&redbfs(&["--help"]));
    let list = help
        .split("Commands:\n")
        .nth(1)
        .expect("--help lists commands");
    let names: Vec<String> = list
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| n != "help")
        .collect();
    for expected in ["mount", "unmount", "snapshot", "completions", "man"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    names
}

#[test]
fn completions_name_every_command_in_each_shell() {
    let commands = commands();
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(&redbfs(&["completions", shell]));
        assert!(!script.trim().is_empty(), "{shell}: empty");
        for c in &commands {
            assert!(script.contains(c.as_str()), "{shell} completions lack {c}");
        }
        let flag = if shell == "fish" {
            "-l foreground"
        } else {
            "--foreground"
        };
        assert!(script.contains(flag), "{shell} lacks mount's flags");
    }
    let bash = stdout(&redbfs(&["completions", "bash"]));
    let checked = Command::new("bash")
        .arg("-n")
        .arg("-c")
        .arg(&bash)
        .output()
        .expect("bash is needed to check the bash completions");
    assert!(
        checked.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let refused = redbfs(&["completions", "tcsh"]);
    assert!(!refused.status.success());
}

/// groff's warnings about `page` (none for a page that parses); fails if groff is missing.
fn groff_warnings(page: &Path) -> String {
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(page)
        .output()
        .expect("groff is missing: install the groff-base package");
    assert!(out.status.success(), "groff failed on {}", page.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn man_pages_parse_and_name_every_command() {
    let commands = commands();
    let dir = tempfile::tempdir().unwrap();

    let top = stdout(&redbfs(&["man"]));
    assert!(
        top.lines().any(|l| l.starts_with(".TH redbfs 1 ")),
        "no .TH header:\n{top}"
    );
    for c in &commands {
        assert!(
            top.contains(&format!("redbfs\\-{c}(1)")),
            "redbfs(1) does not name {c}"
        );
    }
    let printed = dir.path().join("printed.1");
    std::fs::write(&printed, &top).unwrap();
    assert_eq!(groff_warnings(&printed), "");

    let mount = stdout(&redbfs(&["man", "mount"]));
    assert!(mount.lines().any(|l| l.starts_with(".TH redbfs-mount 1 ")));
    assert!(mount.contains("\\-\\-foreground"));
    assert!(!redbfs(&["man", "no-such-command"]).status.success());

    // Every page, as scripts/man writes them.
    let pages = dir.path().join("man");
    stdout(&redbfs(&["man", "--out-dir", pages.to_str().unwrap()]));
    let top_file = std::fs::read_to_string(pages.join("redbfs.1")).unwrap();
    assert_eq!(top_file, top, "--out-dir and stdout differ");
    for page in
        std::iter::once("redbfs".to_string()).chain(commands.iter().map(|c| format!("redbfs-{c}")))
    {
        let p = pages.join(format!("{page}.1"));
        assert!(p.exists(), "no page {page}.1");
        assert_eq!(groff_warnings(&p), "", "{page}.1");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "{page}.1 is {mode:o}");
    }

    // A symlink and a hard link planted at pages' names are replaced, never written through.
    let victim = dir.path().join("victim");
    let linked = dir.path().join("linked");
    std::fs::write(&victim, "keep").unwrap();
    std::fs::write(&linked, "keep too").unwrap();
    std::fs::remove_file(pages.join("redbfs.1")).unwrap();
    std::fs::remove_file(pages.join("redbfs-mount.1")).unwrap();
    std::os::unix::fs::symlink(&victim, pages.join("redbfs.1")).unwrap();
    std::fs::hard_link(&linked, pages.join("redbfs-mount.1")).unwrap();
    stdout(&redbfs(&["man", "--out-dir", pages.to_str().unwrap()]));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert_eq!(std::fs::read_to_string(&linked).unwrap(), "keep too");
    let page = std::fs::symlink_metadata(pages.join("redbfs.1")).unwrap();
    assert!(page.is_file(), "the symlink is still there");
    assert_eq!(
        std::fs::read_to_string(pages.join("redbfs.1")).unwrap(),
        top
    );
}

/// Every numeric option of `mount` has bounds, refused by the option's name before anything
/// starts, in both forms (`--threads N` and mount(8)'s `-o threads=N`).
#[test]
fn numeric_options_out_of_bounds_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let mp = mp.to_str().unwrap();
    for (flag, bad) in [
        ("threads", "100000000"),
        ("threads", "0"),
        ("max-file-bytes", "0"),
        ("max-file-bytes", "4096T"),
        ("max-buffer", "99999999999T"),
        ("quota", "2048T"),
        ("max-files", "0"),
        ("max-path-bytes", "10000000"),
        ("max-depth", "100000"),
        ("keep-history", "40000d"),
        ("replica-interval", "0"),
        ("replica-snapshot-every", "1ms"),
        ("replica-keep", "50000d"),
    ] {
        let flag_arg = format!("--{flag}");
        let option = format!("{}={bad}", flag.replace('-', "_"));
        for out in [
            redbfs(&["mount", mp, &flag_arg, bad]),
            redbfs(&["store.redb", mp, "-o", &option]),
        ] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag} {bad}: {err}");
            assert!(err.contains(&format!("'--{flag} <")), "{flag} {bad}: {err}");
        }
    }
    assert!(
        !Path::new(mp).exists(),
        "a refused mount created its mountpoint"
    );
}

/// The README's test command first checks the system packages it needs, from the one list
/// `.ci/run` installs from, and names each one missing: here a package of a fake list, and
/// `acl` of the real list with `setfacl` taken off PATH.
#[test]
fn the_prerequisite_check_names_each_missing_package() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("scripts/prereqs");
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("packages");
    std::fs::write(
        &fake,
        "# a fake list\nbash bash\nredbfs-fake-package redbfs-no-such-command  # why\n\
         fake-venv python3 -c 'import no_such_module'\n",
    )
    .unwrap();
    let out = Command::new("bash")
        .arg(&script)
        .arg("--check")
        .env("REDBFS_PACKAGES", &fake)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("redbfs-fake-package (for: redbfs-no-such-command)"),
        "{err}"
    );
    assert!(err.contains("fake-venv"), "{err}");
    assert!(
        err.contains("apt-get install -y redbfs-fake-package fake-venv"),
        "{err}"
    );
    assert!(!err.contains("  bash"), "{err}");

    // The real list, on a PATH holding every command it names but setfacl.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let list = std::fs::read_to_string(root.join("scripts/packages")).unwrap();
    let mut commands: Vec<&str> = vec!["bash", "cargo", "python3"];
    for line in list.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 2 && fields.get(2).is_none_or(|f| f.starts_with('#')) {
            commands.push(fields[1]);
        }
    }
    assert!(
        commands.contains(&"setfacl"),
        "acl is no longer in scripts/packages"
    );
    let path = std::env::var_os("PATH").unwrap();
    for c in commands.into_iter().filter(|c| *c != "setfacl") {
        let found = std::env::split_paths(&path)
            .map(|d| d.join(c))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{c} is not installed here: run scripts/prereqs"));
        let _ = std::os::unix::fs::symlink(found, bin.join(c));
    }
    // The interpreter itself, not a version manager's shim that needs the rest of PATH.
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(bin.join("python3"));
    std::os::unix::fs::symlink(stdout(&python).trim(), bin.join("python3")).unwrap();
    let out = Command::new(bin.join("bash"))
        .arg(&script)
        .arg("--check")
        .env("PATH", &bin)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("  acl (for: setfacl)"), "{err}");
    assert_eq!(
        err.matches(" (for: ").count(),
        1,
        "only acl is missing: {err}"
    );
}

#[test]
fn version_names_the_store_format() {
    let expected = format!(
        "redbfs {} (store format {})\n",
        env!("CARGO_PKG_VERSION"),
        redbfs::store::FORMAT_VERSION
    );
    assert_eq!(stdout(&redbfs(&["--version"])), expected);
    assert_eq!(stdout(&redbfs(&["-V"])), expected);
}

/// The README's first command mounts `./memory-store` in the checkout: everything that
/// creates beside it while mounted (the store, its log, write-ahead log and control socket)
/// must be ignored by git, named in `.gitignore`.
#[test]
fn gitignore_covers_what_the_first_command_creates() {
    if !fuse_available() {
        return;
    }
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".gitignore")).unwrap();
    let ignored: Vec<&str> = ignore.lines().map(str::trim).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(redbfs_bin())
        .arg("mount")
        .arg("./memory-store")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let listed = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let while_mounted = listed();
    let unmounted = redbfs(&["unmount", dir.path().join("memory-store").to_str().unwrap()]);
    assert!(
        out.status.success() && unmounted.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&unmounted.stderr)
    );
    for expected in [
        "memory-store",
        "memory-store.redb",
        "memory-store.redb.log",
        "memory-store.redb.wal",
        "memory-store.redb.sock",
    ] {
        assert!(
            while_mounted.iter().any(|n| n == expected),
            "{expected} not in {while_mounted:?}"
        );
    }
    for name in while_mounted.iter().chain(&listed()) {
        assert!(
            ignored.contains(&format!("/{name}").as_str()),
            ".gitignore does not name /{name}"
        );
    }
}
