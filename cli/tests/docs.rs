//! The commands the docs show for installing the CLI are the ones that work from a checkout.

use std::path::{Path, PathBuf};

/// The repository's Markdown files and the CLI's sources: every place a user may copy an
/// install command from.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut dirs = vec![root.join("docs"), root.join("cli"), root.join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = entry.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    dirs.push(p);
                }
            } else if name.ends_with(".md") || (name.ends_with(".rs") && name != "docs.rs") {
                files.push(p);
            }
        }
    }
    files
}

/// `cargo install` of taskq-cli without `--locked` ignores `Cargo.lock` and resolves every
/// dependency again; each command the docs show has it.
#[test]
fn every_documented_install_of_the_cli_is_locked() {
    let mut seen = 0;
    let mut unlocked = vec![];
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // Commands in code blocks and in `backticks` alike.
            for cmd in line.split('`').filter(|c| c.contains("cargo install")) {
                let installs_cli = cmd.contains("taskq-cli") || cmd.contains("--path cli");
                if !installs_cli {
                    continue;
                }
                seen += 1;
                if !cmd.split_whitespace().any(|w| w == "--locked") {
                    unlocked.push(format!("{}:{}: {}", file.display(), n + 1, cmd.trim()));
                }
            }
        }
    }
    assert!(
        seen >= 4,
        "the docs show the install command ({seen} found)"
    );
    assert!(
        unlocked.is_empty(),
        "cargo install without --locked:\n{}",
        unlocked.join("\n")
    );
}
