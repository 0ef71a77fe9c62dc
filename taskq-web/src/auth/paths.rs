//! Links and cookie paths relative to the page a request asked for, so that the dashboard
//! works under any mount prefix.

/// The dashboard root relative to the page at `inner` (the path within the dashboard) when
/// the browser asked for `original`: `./` at depth one, one `../` per level deeper; at the
/// mount point without a trailing slash (`/ops/taskq`), `./taskq/`.
pub(crate) fn relative_root(inner: &str, original: &str) -> String {
    if inner == "/" || inner.is_empty() {
        if original.ends_with('/') {
            return "./".into();
        }
        let last = original.rsplit('/').next().unwrap_or("");
        return format!("./{last}/");
    }
    let depth = inner.trim_start_matches('/').matches('/').count();
    if depth == 0 {
        "./".into()
    } else {
        "../".repeat(depth)
    }
}

/// The link to the overview from the page at `inner` (see [`Ctx::home`]).
pub(crate) fn home_link(inner: &str, original: &str) -> String {
    let root = relative_root(inner, original);
    let prefix = mount_prefix(inner, original);
    let last = prefix.rsplit('/').next().unwrap_or("");
    if last.is_empty() || (inner == "/" && original.ends_with('/')) {
        return root;
    }
    if inner == "/" {
        format!("./{last}")
    } else {
        format!("{root}../{last}")
    }
}

/// The path the dashboard is mounted at (`""` at the root; without a trailing slash).
fn mount_prefix<'a>(inner: &str, original: &'a str) -> &'a str {
    let prefix = if inner == "/" && !original.ends_with('/') {
        original
    } else {
        original.strip_suffix(inner).unwrap_or("")
    };
    prefix.trim_end_matches('/')
}

/// The path the dashboard is mounted at, for the cookies' `Path` (`/` when unknown or odd).
pub(crate) fn cookie_path(inner: &str, original: &str) -> String {
    let prefix = mount_prefix(inner, original);
    if prefix.is_empty()
        || !prefix.starts_with('/')
        || prefix
            .bytes()
            .any(|b| b == b';' || b == b',' || b.is_ascii_whitespace() || b.is_ascii_control())
    {
        "/".into()
    } else {
        prefix.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_relative_to_the_page() {
        assert_eq!(relative_root("/", "/"), "./");
        assert_eq!(relative_root("/", "/ops/taskq"), "./taskq/");
        assert_eq!(relative_root("/", "/ops/taskq/"), "./");
        assert_eq!(relative_root("/tasks", "/ops/taskq/tasks"), "./");
        assert_eq!(relative_root("/tasks/5", "/ops/taskq/tasks/5"), "../");
        assert_eq!(
            relative_root("/tasks/5/retry", "/x/tasks/5/retry"),
            "../../"
        );
        assert_eq!(home_link("/", "/"), "./");
        assert_eq!(home_link("/tasks", "/tasks"), "./");
        assert_eq!(home_link("/tasks/5", "/tasks/5"), "../");
        assert_eq!(home_link("/", "/ops/taskq"), "./taskq");
        assert_eq!(home_link("/tasks", "/ops/taskq/tasks"), "./../taskq");
        assert_eq!(home_link("/tasks/5", "/ops/taskq/tasks/5"), "../../taskq");
        assert_eq!(cookie_path("/", "/ops/taskq"), "/ops/taskq");
        assert_eq!(cookie_path("/tasks/5", "/ops/taskq/tasks/5"), "/ops/taskq");
        assert_eq!(cookie_path("/tasks", "/tasks"), "/");
        assert_eq!(cookie_path("/", "/"), "/");
        assert_eq!(cookie_path("/", "/a;b"), "/");
    }
}
