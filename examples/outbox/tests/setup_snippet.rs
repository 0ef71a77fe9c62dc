//! docs/outbox.md's `Cargo.toml` snippet (section "Sinks") against the workspace: the taskq
//! dependency it shows names only features taskq has, at the workspace's version.

const DOC: &str = include_str!("../../../docs/outbox.md");
const TASKQ_TOML: &str = include_str!("../../../taskq/Cargo.toml");
const WORKSPACE_TOML: &str = include_str!("../../../Cargo.toml");

/// The text of every fenced block of `lang` in the doc.
fn blocks(lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in DOC.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```")
                && line.trim_start().trim_start_matches('`') == lang =>
            {
                current = Some(String::new());
            }
            Some(_) if line.trim_start() == "```" => out.push(current.take().unwrap()),
            Some(text) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The lines of the table `[name]` of a Cargo.toml, up to the next table.
fn table<'a>(toml: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("[{name}]");
    toml.lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .collect()
}

/// The strings between double quotes in `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('"').skip(1).step_by(2).collect()
}

/// The taskq dependency line of the doc's `[dependencies]` block, split at its comment.
fn taskq_line() -> (String, String) {
    let toml = blocks("toml");
    let deps = toml
        .iter()
        .find(|b| b.contains("[dependencies]"))
        .expect("docs/outbox.md has a ```toml block with [dependencies]");
    let line = deps
        .lines()
        .find(|l| l.starts_with("taskq = "))
        .expect("the [dependencies] block has a taskq line");
    let (spec, comment) = line.split_once('#').unwrap_or((line, ""));
    (spec.to_owned(), comment.to_owned())
}

#[test]
fn the_snippet_names_only_features_taskq_has() {
    let ours: Vec<&str> = table(TASKQ_TOML, "features")
        .into_iter()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(name, _)| name.trim())
        .collect();
    assert!(ours.contains(&"nats"), "taskq's features: {ours:?}");
    let (spec, comment) = taskq_line();
    let listed = spec
        .split_once("features = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| quoted(list))
        .expect("the taskq line has a features list");
    assert!(!listed.is_empty(), "{spec}");
    // The features in the list, and the ones its comment offers instead.
    for feature in listed.into_iter().chain(quoted(&comment)) {
        assert!(
            ours.contains(&feature),
            "docs/outbox.md names the taskq feature {feature:?}; taskq/Cargo.toml has {ours:?}"
        );
    }
}

#[test]
fn the_snippet_gives_the_workspace_version() {
    let workspace = table(WORKSPACE_TOML, "workspace.package")
        .into_iter()
        .find(|l| l.starts_with("version = "))
        .map(quoted)
        .and_then(|q| q.first().copied())
        .expect("[workspace.package] has a version");
    let major_minor: Vec<&str> = workspace.split('.').take(2).collect();
    let major_minor = major_minor.join(".");
    let (spec, _) = taskq_line();
    let given = spec
        .split_once("version = ")
        .map(|(_, rest)| quoted(rest))
        .and_then(|q| q.first().copied())
        .expect("the taskq line has a version");
    assert_eq!(
        given, major_minor,
        "docs/outbox.md gives taskq {given:?}; the workspace is {workspace}"
    );
}
