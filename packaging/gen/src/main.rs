//! `roost-docgen OUT_DIR`: writes roost's man pages to `OUT_DIR/man`, its bash, zsh and fish
//! completions to `OUT_DIR/completions` and the package's configuration file `roost.toml` to
//! `OUT_DIR` (see the library), printing each path written.
#![forbid(unsafe_code)]

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        anyhow::bail!("usage: roost-docgen OUT_DIR");
    };
    let written = roost_docgen::write_all(&roost::cli::command(), &PathBuf::from(out))?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
