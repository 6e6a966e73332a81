//! The command line's conventions for shells and manuals: completions (`redbfs completions
//! SHELL`) and man pages (`redbfs man`), both generated from the clap definitions in `args`,
//! the same ones that parse the command line, so neither can name a command or flag the
//! parser does not know.

use clap::CommandFactory;

use super::args::{Cli, Completions, Man};
use super::output;

pub(super) fn completions(a: Completions) -> Result<i32, String> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "redbfs", &mut out);
    output::data(&out)?;
    Ok(0)
}

pub(super) fn man(a: Man) -> Result<i32, String> {
    // As clap_mangen's own generate_to: no page for `help`, and a built command, whose
    // subcommands carry their page names (redbfs-mount).
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    // Every page's footer names the release and store format, as `--version` does.
    let source = format!("redbfs {}", cmd.get_version().unwrap_or_default());
    let page = |c: &clap::Command| clap_mangen::Man::new(c.clone()).source(source.clone());
    if let Some(dir) = a.out_dir {
        // Pages are for everyone: a directory made here is 0755 whatever the umask, and each
        // page 0644, replacing (never writing through) what is at its name.
        if std::fs::symlink_metadata(&dir).is_err() {
            std::fs::create_dir_all(&dir)
                .and_then(|()| {
                    std::fs::set_permissions(
                        &dir,
                        std::os::unix::fs::PermissionsExt::from_mode(0o755),
                    )
                })
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        for c in std::iter::once(&cmd).chain(cmd.get_subcommands().filter(|c| !c.is_hide_set())) {
            let man = page(c);
            let mut out = Vec::new();
            man.render(&mut out).map_err(|e| e.to_string())?;
            crate::private::publish(&dir, &man.get_filename(), &out)?;
        }
        return Ok(0);
    }
    let chosen = match &a.command {
        None => &cmd,
        Some(name) => cmd
            .find_subcommand(name)
            .ok_or_else(|| format!("{name:?} is not a redbfs command (see `redbfs --help`)"))?,
    };
    let mut out = Vec::new();
    page(chosen).render(&mut out).map_err(|e| e.to_string())?;
    output::data(&out)?;
    Ok(0)
}
