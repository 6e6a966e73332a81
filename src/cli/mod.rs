//! The command line: the only place that parses arguments and prints for people. This file
//! dispatches each command to the module of its family; `args` is the grammar, `target` the
//! one rule for reaching a store (its daemon when mounted, its file otherwise), `output`
//! every line printed, `time` durations and dates, `shell` the completions and man pages made
//! from the grammar, `replica` lists replicas and restores from one.

mod args;
mod fstab;
mod history;
mod inspect;
mod maintain;
mod mount;
mod output;
mod replica;
mod shell;
mod target;
mod time;
mod transfer;

use args::{Cli, Cmd};

pub fn main() -> i32 {
    // Nothing redbfs creates is for group or others, whatever umask it was started with: the
    // files have explicit modes, and this covers the directories (scratch copies, a new
    // mountpoint, an export's parents).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    nix::sys::stat::umask(old | nix::sys::stat::Mode::from_bits_truncate(0o077));
    // The grammar is built once (its builder is unoptimised: see Cargo.toml), for both the
    // subcommands' names and the parse.
    let mut grammar = <Cli as clap::CommandFactory>::command();
    let subcommands: Vec<String> = grammar
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .chain(["help".to_string()])
        .collect();
    let args = match fstab::argv(std::env::args_os().collect(), &subcommands) {
        Ok(a) => a,
        Err(e) => {
            output::error(&e);
            return 1;
        }
    };
    let cli = grammar
        .try_get_matches_from_mut(args)
        .and_then(|mut m| {
            <Cli as clap::FromArgMatches>::from_arg_matches_mut(&mut m)
                .map_err(|e| e.format(&mut grammar))
        })
        .unwrap_or_else(|e| e.exit());
    if !matches!(cli.cmd, Cmd::Mount(_)) {
        // The daemon sets up its own log; every other command's warnings reach the terminal.
        terminal_warnings();
    }
    let res = run(cli.cmd);
    if output::stdout_closed() {
        // The reader went away (`| head`): the command unwound; it ends as SIGPIPE ends tools.
        output::reader_gone();
    }
    match res {
        Ok(code) => code,
        Err(e) => {
            output::error(&e);
            1
        }
    }
}

/// Warnings (and errors) logged by the library print on stderr; `REDBFS_LOG` may say more.
fn terminal_warnings() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let layer = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time()
        .with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry()
        .with(log_filter("redbfs=warn"))
        .with(layer)
        .try_init();
}

/// What to log: `REDBFS_LOG`'s `target=level` directives (`redbfs=debug,fuser=info`), or
/// `default` when it is unset or does not parse.
pub(crate) fn log_filter(default: &str) -> tracing_subscriber::filter::Targets {
    std::env::var("REDBFS_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| default.parse().unwrap_or_default())
}

/// Runs one command; its exit code, or the error to print.
fn run(cmd: Cmd) -> Result<i32, String> {
    match cmd {
        Cmd::Mount(a) => mount::mount(*a),
        Cmd::Unmount(a) => mount::unmount(a),
        Cmd::Promote(a) => mount::promote(a),
        Cmd::Status(a) => inspect::status(a),
        Cmd::Check(a) => inspect::check(a),
        Cmd::Ls(a) => inspect::ls(a),
        Cmd::Cat(a) => inspect::cat(a),
        Cmd::Tree(a) => inspect::tree(a),
        Cmd::Du(a) => inspect::du(a),
        Cmd::Quota(a) => inspect::quota(a),
        Cmd::Stats(a) => inspect::stats(a),
        Cmd::Snapshot(a) => transfer::snapshot(a),
        Cmd::VerifyCopy(a) => crate::tools::verify_copy_args(&a.path, &a.tables).map(|()| 0),
        Cmd::Restore(a) if a.from.is_some() => replica::restore_from(a),
        Cmd::Restore(a) => transfer::restore(a),
        Cmd::Replica(a) => replica::run(a),
        Cmd::Export(a) => transfer::export(a),
        Cmd::Import(a) => transfer::import(a),
        Cmd::Expire(a) => maintain::expire(a),
        Cmd::Compact(a) => maintain::compact(a),
        Cmd::Log(a) => history::log(a),
        Cmd::Show(a) => history::show(a),
        Cmd::Diff(a) => history::diff(a),
        Cmd::Mark(a) => history::mark(a),
        Cmd::Revert(a) => history::revert(a),
        Cmd::Rollback(a) => history::rollback(a),
        Cmd::Redact(a) => history::redact(a),
        Cmd::Completions(a) => shell::completions(a),
        Cmd::Man(a) => shell::man(a),
    }
}
