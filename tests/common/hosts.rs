//! Hosts and object storage for the replica and follower tests: a `Host` is one machine's
//! directory (store, mountpoint, daemon log) driven through the binary with its own
//! environment, and `Moto` is the local S3 server (tests/replica/.venv, installed by
//! tests/clients/setup.sh) on a free port, killed on drop.
//!
//! Every wait is a bounded poll of `redbfs status`; nothing here asserts a duration.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::redbfs_bin;

/// Files (with content) and directories (`None`) under a root, by relative path.
pub type Tree = BTreeMap<String, Option<Vec<u8>>>;

/// Files (with content) and directories under `root`.
pub fn tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(rel, None);
                todo.push(p);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// A `file://` replica in a new temporary directory (removed with the guard), and its URL.
pub fn file_replica() -> (tempfile::TempDir, String) {
    let rep = tempfile::tempdir().unwrap();
    let url = format!("file://{}/replica", rep.path().display());
    (rep, url)
}

/// One operation of an agent's memory tool (write, replace by rename, delete, mkdir) under
/// `mp/memories`; `i` picks which, so a sequence of `i` is a reproducible session.
pub fn memory_op(mp: &Path, i: usize) {
    let d = mp.join("memories");
    let name = |k: usize| d.join(format!("note-{}.md", k % 7));
    match i % 5 {
        0 | 1 => std::fs::write(name(i), format!("note {i}\n").repeat(i % 13 + 1)).unwrap(),
        2 => {
            let tmp = d.join(format!(".tmp-{i}"));
            std::fs::write(&tmp, format!("replaced at {i}\n")).unwrap();
            std::fs::rename(&tmp, name(i + 3)).unwrap();
        }
        3 => {
            let _ = std::fs::remove_file(name(i + 1));
        }
        _ => std::fs::create_dir_all(d.join(format!("topic-{}", i % 4))).unwrap(),
    }
}

/// Polls `done` every `every` until it answers `Some`, for at most `secs` seconds; then fails
/// the test with what `why` says.
fn poll<T>(
    secs: u64,
    every: u64,
    mut done: impl FnMut() -> Option<T>,
    why: impl Fn() -> String,
) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = done() {
            return v;
        }
        assert!(Instant::now() < until, "{}", why());
        std::thread::sleep(Duration::from_millis(every));
    }
}

/// One "host": a directory with a store, a mountpoint and a daemon log, whose commands run
/// with `env` set. Unmounted on drop.
pub struct Host {
    pub dir: tempfile::TempDir,
    pub mp: PathBuf,
    pub store: PathBuf,
    pub env: Vec<(String, String)>,
    pub mounted: bool,
}

impl Host {
    /// A host with nothing mounted and no store yet.
    pub fn new(env: &[(String, String)]) -> Host {
        let dir = tempfile::Builder::new()
            .prefix("redbfs-host-")
            .tempdir()
            .unwrap();
        Host {
            mp: dir.path().join("mnt"),
            store: dir.path().join("mnt.redb"),
            dir,
            env: env.to_vec(),
            mounted: false,
        }
    }

    /// A fresh store mounted with `options`.
    pub fn mounted(options: &[&str], env: &[(String, String)]) -> Host {
        let mut h = Host::new(env);
        h.mount(options);
        h
    }

    /// A host whose store ships to `url` every `interval` (mounted).
    pub fn writer(url: &str, interval: &str, env: &[(String, String)]) -> Host {
        Host::mounted(&["--replica", url, "--replica-interval", interval], env)
    }

    /// A host following `url` (mounted).
    pub fn follower(url: &str, env: &[(String, String)]) -> Host {
        Host::mounted(&["--follow", url, "--follow-interval", "100ms"], env)
    }

    /// `redbfs mount` of this host's store with `options`, whatever it answers.
    pub fn try_mount(&self, options: &[&str]) -> Output {
        let log = self.dir.path().join("daemon.log");
        let mut args = vec![
            "mount",
            self.mp.to_str().unwrap(),
            "--store",
            self.store.to_str().unwrap(),
            "--log-file",
            log.to_str().unwrap(),
        ];
        args.extend(options);
        self.run(&args)
    }

    /// Mounts the store (again); it keeps its replica settings unless `options` change them.
    pub fn mount(&mut self, options: &[&str]) {
        let out = self.try_mount(options);
        assert!(
            out.status.success(),
            "mount {options:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        self.mounted = true;
    }

    /// A clean unmount.
    pub fn unmount(&mut self) {
        let out = self.run(&["unmount", self.mp.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "unmount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.mounted = false;
    }

    /// `redbfs ARGS...` with this host's environment.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(redbfs_bin())
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap()
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// `redbfs status --json` of the mount.
    pub fn status(&self) -> serde_json::Value {
        let out = self.run(&["status", self.mp.to_str().unwrap(), "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits (bounded) until every replica holds the store's last commit; returns that commit.
    pub fn caught_up(&self) -> u64 {
        poll(
            120,
            50,
            || {
                let s = self.status();
                let all = s["replicas"].as_array().unwrap();
                let done = !all.is_empty() && all.iter().all(|x| x["commits_behind"] == 0);
                done.then(|| s["commits"].as_u64().unwrap())
            },
            || {
                format!(
                    "the replica never caught up: {}\n{}",
                    self.status(),
                    self.log()
                )
            },
        )
    }

    /// Waits (bounded) until this writer's first replica holds its last commit; returns the
    /// commit it shipped.
    pub fn shipped(&self) -> u64 {
        poll(
            60,
            20,
            || {
                let s = self.status();
                let r = &s["replicas"][0];
                (r["commits_behind"] == 0).then(|| r["shipped_commit"].as_u64().unwrap())
            },
            || format!("never shipped: {}\n{}", self.status(), self.log()),
        )
    }

    /// Waits (bounded) until this follower has applied commit `commit`.
    pub fn reaches(&self, commit: u64) {
        poll(
            60,
            20,
            || {
                let s = self.status();
                (s["follower"]["follower_commit"].as_u64().unwrap() >= commit).then_some(())
            },
            || {
                format!(
                    "the follower never reached commit {commit}: {}\n{}",
                    self.status(),
                    self.log()
                )
            },
        )
    }

    /// The daemon SIGKILLed (the store and its log stay), the mount detached.
    pub fn kill(&mut self) {
        let pid = self.status()["pid"].as_u64().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let proc = PathBuf::from(format!("/proc/{pid}"));
        poll(
            60,
            10,
            || (!proc.exists()).then_some(()),
            || format!("daemon {pid} outlived SIGKILL"),
        );
        let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        self.mounted = false;
    }

    /// The machine is lost: the daemon killed, the store and its log deleted.
    pub fn lose(&mut self) {
        self.kill();
        for p in [
            self.store.clone(),
            PathBuf::from(format!("{}.wal", self.store.display())),
        ] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// `restore --from url [--at at]` into a new machine's directory; the restored tree.
    pub fn restore(&self, url: &str, at: Option<&str>) -> Tree {
        let fresh = tempfile::tempdir().unwrap();
        let store = fresh.path().join("new-host").join("memory.redb");
        let mut args = vec!["restore", "--from", url, store.to_str().unwrap()];
        if let Some(at) = at {
            args.extend(["--at", at]);
        }
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "restore --from: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let export = fresh.path().join("export");
        let out = self.run(&["export", store.to_str().unwrap(), export.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tree(&export)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if self.mounted {
            let _ = self.run(&["unmount", self.mp.to_str().unwrap()]);
        }
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The local S3 server (moto) on a free port; killed on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Moto {
    /// Starts the server and waits (bounded) until it accepts connections.
    pub fn start() -> Moto {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replica/.venv/bin/moto_server");
        assert!(
            bin.exists(),
            "{} is missing: run tests/clients/setup.sh (it installs the pinned moto server)",
            bin.display()
        );
        let port = free_port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        poll(
            60,
            100,
            || TcpStream::connect(("127.0.0.1", port)).ok().map(drop),
            || "moto_server did not start".to_string(),
        );
        Moto { child, port }
    }

    /// A server with bucket `name` made.
    pub fn with_bucket(name: &str) -> Moto {
        let moto = Moto::start();
        moto.bucket(name);
        moto
    }

    /// Creates a bucket (moto does not check signatures).
    pub fn bucket(&self, name: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// The environment that points redbfs at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        s3_env(self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment that points redbfs at an S3 server on 127.0.0.1:`port` (a proxy in front
/// of moto, say), with moto's test credentials.
pub fn s3_env(port: u16) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ("AWS_ALLOW_HTTP", "true".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
