//! Unit tests of the attribute parser: accepted values and every error message.

use super::*;
use quote::quote;

fn err(tokens: TokenStream) -> String {
    parse_attrs(tokens).unwrap_err().to_string()
}

fn all_errors(tokens: TokenStream) -> Vec<String> {
    parse_attrs(tokens)
        .unwrap_err()
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn empty_means_defaults() {
    assert_eq!(parse_attrs(quote!()).unwrap(), TaskAttrs::default());
}

#[test]
fn parses_every_key() {
    let a = parse_attrs(quote!(
        name = "export.v1",
        queue = "orders",
        max_attempts = 5,
        priority = -3,
        timeout = "1m30s",
        backoff = "constant(5s)",
        max_snoozes = 0,
        ttl = "2h",
    ))
    .unwrap();
    assert_eq!(
        a,
        TaskAttrs {
            name: Some("export.v1".into()),
            queue: Some("orders".into()),
            max_attempts: Some(5),
            priority: Some(-3),
            timeout: Some(Duration::from_secs(90)),
            backoff: Some(BackoffSpec::Constant(Duration::from_secs(5))),
            max_snoozes: Some(0),
            ttl: Some(Duration::from_secs(7200)),
            unique: None,
            ..TaskAttrs::default()
        }
    );
}

fn names(by: &Option<Vec<Ident>>) -> Option<Vec<String>> {
    by.as_ref()
        .map(|v| v.iter().map(|i| i.unraw().to_string()).collect())
}

#[test]
fn unique_forms() {
    let u = parse_attrs(quote!(unique)).unwrap().unique.unwrap();
    assert_eq!((names(&u.by), u.hold), (None, HoldSpec::Pending));
    let u = parse_attrs(quote!(unique())).unwrap().unique.unwrap();
    assert_eq!((names(&u.by), u.hold), (None, HoldSpec::Pending));
    let u = parse_attrs(quote!(queue = "q", unique(by = [a, r#type], while = "running"),))
        .unwrap()
        .unique
        .unwrap();
    assert_eq!(
        (names(&u.by), u.hold),
        (Some(vec!["a".into(), "type".into()]), HoldSpec::Running)
    );
    let u = parse_attrs(quote!(unique(by = [], period = "10m")))
        .unwrap()
        .unique
        .unwrap();
    assert_eq!(
        (names(&u.by), u.hold),
        (Some(vec![]), HoldSpec::Window(Duration::from_secs(600)))
    );
    let u = parse_attrs(quote!(unique(while = "pending",)))
        .unwrap()
        .unique
        .unwrap();
    assert_eq!(u.hold, HoldSpec::Pending);
}

#[test]
fn unique_misuse() {
    let e = err(quote!(unique(bye = [a])));
    assert!(
        e.contains("unknown `unique` option `bye`; did you mean `by`?"),
        "{e}"
    );
    let e = err(quote!(unique(while = "finished")));
    assert!(e.contains("invalid `while` \"finished\""), "{e}");
    let e = err(quote!(unique(while = running)));
    assert!(e.contains("`while` expects a string literal"), "{e}");
    let e = err(quote!(unique(period = "10")));
    assert!(
        e.contains("invalid `period` \"10\": `10` has no unit"),
        "{e}"
    );
    let e = err(quote!(unique(period = "0s")));
    assert!(e.contains("greater than zero"), "{e}");
    let e = err(quote!(unique(period = "4000d")));
    assert!(e.contains("at most 3660 days"), "{e}");
    let e = err(quote!(unique(while = "running", period = "1m")));
    assert!(e.contains("cannot be combined"), "{e}");
    let e = err(quote!(unique(by = ["a"])));
    assert!(e.contains("identifiers, not strings"), "{e}");
    let e = err(quote!(unique(by = a)));
    assert!(e.contains("`by` expects a list"), "{e}");
    let e = err(quote!(unique(by = [a], by = [b])));
    assert!(e.contains("duplicate `by`"), "{e}");
    let e = err(quote!(unique(by)));
    assert!(e.contains("`by` needs a value"), "{e}");
    let e = err(quote!(unique = true));
    assert!(e.contains("`unique` is not `key = value`"), "{e}");
    let e = err(quote!(unique, unique));
    assert!(e.contains("duplicate `unique`"), "{e}");
    let e = err(quote!(queue("x")));
    assert!(e.contains("`queue` needs a value"), "{e}");
    let e = err(quote!(uniq));
    assert!(e.contains("did you mean `unique`?"), "{e}");
}

#[test]
fn follow_up_targets() {
    let a = parse_attrs(quote!(
        on_dead = notify_ops,
        on_success = crate::flow::next_step
    ))
    .unwrap();
    assert_eq!(format!("{:?}", a.on_dead.unwrap()), "Target(notify_ops)");
    let t = a.on_success.unwrap();
    assert_eq!(t.last(), "next_step");
    let p = t.struct_path();
    assert_eq!(quote!(#p).to_string(), "crate :: flow :: NextStep");
    let e = err(quote!(on_dead = "notify_ops"));
    assert!(
        e.contains("`on_dead` expects the path of a `#[taskq::task]` fn, not a string"),
        "{e}"
    );
    let e = err(quote!(on_success = 3));
    assert!(
        e.contains("whose only payload parameter is `taskq::SucceededTask`"),
        "{e}"
    );
    let e = err(quote!(on_dead = notify::<u8>));
    assert!(e.contains("without generic arguments"), "{e}");
    let e = err(quote!(on_dead = a, on_dead = b));
    assert!(e.contains("duplicate `on_dead`"), "{e}");
    let e = err(quote!(on_dead));
    assert!(
        e.contains("`on_dead` needs a value: `on_dead = notify_ops`"),
        "{e}"
    );
}

#[test]
fn cron_keys() {
    let a = parse_attrs(quote!(
        cron = " 0 */5 * * * * ",
        timezone = "Europe/Paris",
        missed_ticks = "all(3)"
    ))
    .unwrap();
    assert_eq!(a.cron.as_deref(), Some("0 */5 * * * *"));
    assert_eq!(a.timezone.as_deref(), Some("Europe/Paris"));
    assert_eq!(a.missed_ticks, Some(Missed::All(3)));
    assert!(err(quote!(cron = "0 25 * * *")).contains("invalid `cron` \"0 25 * * *\""));
    assert!(err(quote!(cron = 5)).contains("`cron` expects a string literal"));
    assert!(
        err(quote!(cron = "@daily", timezone = "Mars/Olympus"))
            .contains("unknown time zone \"Mars/Olympus\"")
    );
    assert!(err(quote!(timezone = "UTC")).contains("`timezone` only applies to a recurring task"));
    assert!(err(quote!(missed_ticks = "skip")).contains("`missed_ticks` only applies"));
    assert!(err(quote!(cron = "@daily", missed_ticks = "never")).contains("unknown policy"));
}

#[test]
fn unknown_key_suggests_the_closest() {
    let e = err(quote!(queu = "x"));
    assert!(
        e.contains("unknown `#[taskq::task]` attribute `queu`"),
        "{e}"
    );
    assert!(e.contains("did you mean `queue`?"), "{e}");
    let e = err(quote!(colour = "x"));
    assert!(!e.contains("did you mean"), "{e}");
}

#[test]
fn duplicate_key_is_an_error() {
    let e = err(quote!(queue = "a", queue = "b"));
    assert!(e.contains("duplicate `queue`"), "{e}");
}

#[test]
fn wrong_literal_types() {
    let e = err(quote!(max_attempts = "5"));
    assert!(
        e.contains("`max_attempts` expects an integer literal"),
        "{e}"
    );
    assert!(e.contains("found a string literal"), "{e}");
    let e = err(quote!(queue = 5));
    assert!(e.contains("`queue` expects a string literal"), "{e}");
    let e = err(quote!(queue = QUEUE));
    assert!(e.contains("constants are not supported"), "{e}");
    let e = err(quote!(timeout = 30));
    assert!(
        e.contains("`timeout` expects a string literal, e.g. `timeout = \"30s\"`"),
        "{e}"
    );
}

#[test]
fn values_are_range_checked() {
    assert!(err(quote!(max_attempts = 0)).contains("at least 1"));
    assert!(err(quote!(max_attempts = -1)).contains("at least 1"));
    assert!(err(quote!(max_attempts = 4294967296)).contains("at most"));
    assert!(err(quote!(priority = 40000)).contains("must fit in an i16"));
    assert_eq!(
        parse_attrs(quote!(priority = -32768)).unwrap().priority,
        Some(i16::MIN)
    );
    assert!(err(quote!(queue = "")).contains("the queue name must not be empty"));
    let long = "q".repeat(65);
    assert!(err(quote!(queue = #long)).contains("65 bytes long, the limit is 64"));
    assert!(err(quote!(queue = "a\nb")).contains("control characters"));
    assert!(err(quote!(name = " x")).contains("whitespace"));
    assert!(err(quote!(name = "")).contains("the task name must not be empty"));
    assert!(err(quote!(timeout = "0s")).contains("greater than zero"));
    assert!(err(quote!(timeout = "30")).contains("`30` has no unit"));
    assert!(err(quote!(backoff = "linear(1s)")).contains("unknown backoff kind"));
    assert!(err(quote!(max_snoozes = -1)).contains("between 0 and"));
    assert!(err(quote!(max_snoozes = 4294967296)).contains("between 0 and"));
    assert!(err(quote!(max_snoozes = "5")).contains("expects an integer literal"));
    assert!(err(quote!(ttl = "0s")).contains("`ttl` must be greater than zero"));
    assert!(err(quote!(ttl = 60)).contains("`ttl` expects a string literal"));
    assert!(err(quote!(ttl = "4000d")).contains("exceeds the maximum of 3660 days"));
    assert!(err(quote!(ttl = "1 hour")).contains("invalid `ttl`"));
}

#[test]
fn several_errors_are_reported_together() {
    let errors = all_errors(quote!(queue = "", max_attempts = 0, bogus = 1));
    assert_eq!(errors.len(), 3, "{errors:?}");
}

#[test]
fn syntax_errors() {
    assert!(err(quote!(queue)).contains("`queue` needs a value: `queue = \"orders\"`"));
    assert!(err(quote!("orders")).contains("expected `key = value`"));
    assert!(err(quote!(queue = "a" max_attempts = 1)).contains("expected `,`"));
}
