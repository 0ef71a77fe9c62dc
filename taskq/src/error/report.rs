//! How an [`Error`] reads: its sentence, the chain of causes each shown once, Rust type names
//! as code writes them.

use std::fmt;

/// Writes `e` the way a user should read it: its `Display`, then (on following lines, after
/// `Caused by:`) the messages of its sources that the text does not already contain.
pub(super) fn write_report(f: &mut fmt::Formatter<'_>, e: &dyn std::error::Error) -> fmt::Result {
    let messages = chain_messages(e.to_string(), e.source());
    let (first, causes) = messages.split_first().expect("at least the error itself");
    f.write_str(first)?;
    match causes {
        [] => Ok(()),
        [only] => write!(f, "\n\nCaused by:\n    {only}"),
        many => {
            f.write_str("\n\nCaused by:")?;
            for (i, m) in many.iter().enumerate() {
                write!(f, "\n    {i}: {m}")?;
            }
            Ok(())
        }
    }
}

/// `top` followed by the messages of the error chain starting at `next`, each distinct piece
/// of text once: a source is left out when its message is already contained in one shown
/// (a wrapper whose `Display` includes its source, like `sqlx::Error`), or when it only wraps
/// a source whose message is already shown (it would add nothing but its label).
pub(crate) fn chain_messages(
    top: String,
    mut next: Option<&(dyn std::error::Error + 'static)>,
) -> Vec<String> {
    let mut shown = vec![top];
    while let Some(e) = next {
        let msg = e.to_string();
        let inner = e.source();
        let covered = |m: &str| shown.iter().any(|s| s.contains(m));
        let only_wraps_shown = inner.is_some_and(|i| {
            let im = i.to_string();
            !im.is_empty() && msg.ends_with(&im) && covered(&im)
        });
        if !msg.is_empty() && !covered(&msg) && !only_wraps_shown {
            shown.push(msg);
        }
        next = inner;
    }
    shown
}

/// A Rust type name as code writes it: the module path of every segment dropped, generics
/// included (`sqlx_core::pool::Pool<sqlx_mysql::database::MySql>` → `Pool<MySql>`,
/// `alloc::string::String` → `String`). For names from [`std::any::type_name`].
pub(crate) fn short_type_name(full: &str) -> String {
    fn flush(path: &mut String, out: &mut String) {
        match path.rfind("::") {
            // `<T as Trait>::Assoc`: the path starts with `::`; keep it.
            Some(0) => out.push_str(path),
            Some(i) if path.starts_with("::") => {
                out.push_str("::");
                out.push_str(&path[i + 2..]);
            }
            Some(i) => out.push_str(&path[i + 2..]),
            None => out.push_str(path),
        }
        path.clear();
    }
    let mut out = String::with_capacity(full.len());
    let mut path = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || matches!(c, '_' | ':' | '{' | '}') {
            path.push(c);
        } else {
            flush(&mut path, &mut out);
            out.push(c);
        }
    }
    flush(&mut path, &mut out);
    out
}

/// The two type names of a [`Error::DuplicateTaskName`]: short, unless that makes them equal.
pub(super) fn type_pair(first: &str, second: &str) -> (String, String) {
    let (a, b) = (short_type_name(first), short_type_name(second));
    if a == b {
        (first.to_owned(), second.to_owned())
    } else {
        (a, b)
    }
}
