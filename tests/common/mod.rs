//! Shared harness for tests that need a real mount: a `TestMount` mounts a fresh store in a
//! temporary directory through the `redbfs` binary and unmounts it on drop.
//!
//! FUSE tests fail loudly where `/dev/fuse` is missing, unless `REDBFS_SKIP_FUSE=1` is set on
//! purpose; then `fuse_available()` returns false and the caller returns early.

#![allow(dead_code)]

pub mod core_fs;
pub mod hosts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `redbfs` binary built for this test run.
pub fn redbfs_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_redbfs"))
}

/// Whether FUSE tests should run. Panics (fails the test) when `/dev/fuse` is missing and the
/// skip was not asked for.
pub fn fuse_available() -> bool {
    if std::env::var("REDBFS_SKIP_FUSE").as_deref() == Ok("1") {
        eprintln!("REDBFS_SKIP_FUSE=1: skipping a FUSE test on purpose");
        return false;
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: FUSE tests need it (set REDBFS_SKIP_FUSE=1 to skip them on purpose)"
    );
    true
}

/// Runs `redbfs ARGS...` and returns its output.
pub fn redbfs(args: &[&str]) -> Output {
    Command::new(redbfs_bin())
        .args(args)
        .output()
        .expect("run redbfs")
}

/// Runs `cmd` with its output captured, failing the test if it has not finished within
/// `limit` (a hang is a failure, not a hung suite).
pub fn run_within(mut cmd: Command, limit: std::time::Duration) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still running after {limit:?}; stderr so far: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The standard output of a command that must succeed (the test fails with its exit status
/// and both outputs otherwise).
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A mounted store in a temporary directory: `<tmp>/mnt` backed by `<tmp>/mnt.redb`.
pub struct TestMount {
    pub dir: tempfile::TempDir,
    pub mountpoint: PathBuf,
    pub store: PathBuf,
    pub log: PathBuf,
    extra_args: Vec<String>,
    mounted: bool,
}

impl TestMount {
    /// Mounts a fresh store with default options.
    pub fn new() -> TestMount {
        TestMount::with_args(&[])
    }

    /// Mounts a fresh store, passing `args` to `redbfs mount` after the defaults.
    pub fn with_args(args: &[&str]) -> TestMount {
        let dir = tempfile::Builder::new()
            .prefix("redbfs-test-")
            .tempdir()
            .expect("tempdir");
        let mountpoint = dir.path().join("mnt");
        let store = dir.path().join("mnt.redb");
        let log = dir.path().join("daemon.log");
        let mut m = TestMount {
            dir,
            mountpoint,
            store,
            log,
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            mounted: false,
        };
        m.mount();
        m
    }

    /// Mounts (again) the same store at the same mountpoint.
    pub fn mount(&mut self) {
        assert!(!self.mounted, "already mounted");
        let mut cmd = Command::new(redbfs_bin());
        cmd.arg("mount")
            .arg(&self.mountpoint)
            .arg("--store")
            .arg(&self.store)
            .arg("--log-file")
            .arg(&self.log)
            .args(&self.extra_args);
        let out = cmd.output().expect("run redbfs mount");
        assert!(
            out.status.success(),
            "redbfs mount failed: {}{}\nlog:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        self.mounted = true;
    }

    /// Unmounts and waits for the daemon to close the store.
    pub fn unmount(&mut self) {
        if !self.mounted {
            return;
        }
        self.mounted = false;
        let out = Command::new(redbfs_bin())
            .arg("unmount")
            .arg(&self.mountpoint)
            .output()
            .expect("run redbfs unmount");
        assert!(
            out.status.success(),
            "redbfs unmount failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Mounts the same store again with `args` in place of the ones it was made with.
    pub fn mount_with(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
        self.mount();
    }

    /// Mounts again after the daemon was killed: `redbfs mount` must clear the stale mount.
    pub fn mount_after_crash(&mut self) {
        self.mounted = false;
        self.mount();
    }

    /// Unmounts and mounts the same store again.
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if self.mounted {
            self.mounted = false;
            let _ = Command::new(redbfs_bin())
                .arg("unmount")
                .arg(&self.mountpoint)
                .output();
        }
    }
}

/// A seeded PRNG (splitmix64) for reproducible random tests: a failure prints its seed and
/// `REDBFS_SEED=<seed>` replays it.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.next()
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// An index in `0..n`.
    pub fn pick(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `REDBFS_SEED` when set, else `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("REDBFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// FNV-1a of `bytes`: names content in failure messages without printing it.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// One entry found by `walk_tree`: its lstat, and the bytes of a regular file.
pub struct Walked {
    pub meta: std::fs::Metadata,
    pub content: Option<Vec<u8>>,
}

/// Every entry below `root` (not `root` itself), by path relative to it, symlinks not
/// followed. Errors name the path and the call that failed.
pub fn walk_tree(root: &Path) -> Result<BTreeMap<PathBuf, Walked>, String> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Walked>) -> Result<(), String> {
        let rd = std::fs::read_dir(dir).map_err(|e| format!("read_dir {}: {e}", dir.display()))?;
        for ent in rd {
            let path = ent
                .map_err(|e| format!("read_dir {}: {e}", dir.display()))?
                .path();
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| format!("lstat {}: {e}", path.display()))?;
            let content = if meta.is_file() {
                Some(std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?)
            } else {
                None
            };
            let is_dir = meta.is_dir();
            let rel = path
                .strip_prefix(root)
                .expect("below the root")
                .to_path_buf();
            out.insert(rel, Walked { meta, content });
            if is_dir {
                go(root, &path, out)?;
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out)?;
    Ok(out)
}

/// The pid of the daemon serving the mount at `mountpoint`.
pub fn daemon_pid(mountpoint: &Path) -> u32 {
    let status = ok(redbfs(&["status", mountpoint.to_str().unwrap(), "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    v["pid"].as_u64().unwrap() as u32
}

/// A field of /proc/PID/status (`VmRSS:`, `VmHWM:`), in kB.
pub fn proc_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// How far process `pid`'s peak RSS rises over `f` above its RSS when `f` starts (kB): the
/// peak is reset first.
pub fn peak_growth<T>(pid: u32, f: impl FnOnce() -> T) -> (T, u64) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = proc_kb(pid, "VmRSS:");
    let out = f();
    (out, proc_kb(pid, "VmHWM:").saturating_sub(before))
}

/// A socket bound at a mount's control socket path in the daemon's place (the real one moved
/// aside), to play a daemon that misbehaves; dropped, it gives the path back to the daemon.
pub struct StandIn {
    sock: PathBuf,
    aside: PathBuf,
}

impl StandIn {
    pub fn new(m: &TestMount) -> (StandIn, std::os::unix::net::UnixListener) {
        let sock = m.dir.path().join("mnt.redb.sock");
        let aside = m.dir.path().join("real.sock");
        std::fs::rename(&sock, &aside).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        (StandIn { sock, aside }, listener)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
        let _ = std::fs::rename(&self.aside, &self.sock);
    }
}
