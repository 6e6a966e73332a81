//! systemd's readiness protocol (sd_notify(3)) for `redbfs mount --foreground` under a
//! `Type=notify` service: `READY=1` once the mount answers, `STOPPING=1` when the FUSE session
//! ends (a signal, `redbfs unmount`, or a `umount` by anyone). Each message is one datagram of
//! `KEY=VALUE` lines sent to the Unix socket named by `$NOTIFY_SOCKET`: a path, or an abstract
//! socket when it starts with `@`.
//!
//! The variable is taken out of the environment when the command starts, so nothing this
//! process runs (fusermount3, the background daemon) inherits it: only the service's main
//! process speaks for the service. A message that cannot be sent is logged and the mount
//! carries on, as sd_notify's callers do.

use std::ffi::{OsStr, OsString};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::Mutex;

/// The variable systemd sets for a `Type=notify` service.
pub const ENV: &str = "NOTIFY_SOCKET";

/// Where to send, when this process is the one systemd waits for: the variable's value, read
/// when sending so that an address this module cannot reach is logged once logging is set up.
static SOCKET: Mutex<Option<OsString>> = Mutex::new(None);

/// Takes `$NOTIFY_SOCKET` out of the environment; when `speak` (the daemon runs in the
/// foreground, as the service's main process) keeps it to send to.
///
/// Must run before this process starts a thread: the environment is not thread-safe.
pub fn init(speak: bool) {
    let Some(value) = std::env::var_os(ENV) else {
        return;
    };
    // SAFETY: called from the command line's entry, before any thread exists (see above), so
    // nothing reads the environment concurrently.
    unsafe { std::env::remove_var(ENV) };
    if speak {
        *SOCKET.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
    }
}

/// The socket address `$NOTIFY_SOCKET` names: an absolute path, or `@name` for the abstract
/// socket `name`.
pub fn address(value: &OsStr) -> Result<SocketAddr, String> {
    let bytes = value.as_bytes();
    let shown = value.to_string_lossy();
    let r = match bytes.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
        Some(b'/') => SocketAddr::from_pathname(value),
        _ => return Err(format!("{shown:?} is neither an absolute path nor @name")),
    };
    r.map_err(|e| format!("{shown:?}: {e}"))
}

/// The FUSE session is about to serve `mountpoint`: `READY=1` (with a status line for
/// `systemctl status`) once a stat of it answers, from a thread of its own, since the session
/// answers only after the caller returns. Nothing is sent if the stat fails: the session
/// ended before it served anything, and the daemon is exiting.
pub fn ready_once_answering(mountpoint: PathBuf) {
    if SOCKET.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("notify-ready".into())
        .spawn(move || match std::fs::metadata(&mountpoint) {
            Ok(_) => send(&format!(
                "READY=1\nSTATUS=mounted {}\n",
                mountpoint.display()
            )),
            Err(e) => tracing::warn!("not telling systemd READY=1: the mount did not answer: {e}"),
        });
    if let Err(e) = spawned {
        tracing::warn!("not telling systemd READY=1: {e}");
    }
}

/// The FUSE session has ended and the store is being closed: `STOPPING=1`.
pub fn stopping(status: &str) {
    send(&format!("STOPPING=1\nSTATUS={status}\n"));
}

fn send(message: &str) {
    let guard = SOCKET.lock().unwrap_or_else(|p| p.into_inner());
    let Some(value) = guard.as_ref() else {
        return;
    };
    let sent = address(value).and_then(|addr| {
        UnixDatagram::unbound()
            .and_then(|s| s.send_to_addr(message.as_bytes(), &addr))
            .map_err(|e| e.to_string())
    });
    if let Err(e) = sent {
        // systemd's `vsock:` addresses are not reached here.
        let first = message.lines().next().unwrap_or_default();
        tracing::warn!("could not tell systemd {first} on {ENV}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        let p = address(OsStr::new("/run/systemd/notify")).unwrap();
        assert_eq!(
            p.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let a = address(OsStr::new("@sd-notify/1")).unwrap();
        assert_eq!(a.as_abstract_name(), Some(&b"sd-notify/1"[..]));
        for bad in ["", "relative/sock", "vsock:2:1234"] {
            assert!(address(OsStr::new(bad)).is_err(), "{bad:?} accepted");
        }
    }
}
