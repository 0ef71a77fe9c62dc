//! Where requests may come from: the `Host` names the dashboard answers (against DNS
//! rebinding) and the same-origin check of every change (`Origin`, `Sec-Fetch-Site`), which
//! refuses cross-site requests whatever the authentication mode.

use axum::http::{HeaderMap, Uri, header};

/// One allowed `Host`: a name or address, with a port or any port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPattern {
    /// Lowercase; an IPv6 address in brackets (`[::1]`).
    host: String,
    port: Option<u16>,
}

impl HostPattern {
    /// Parses `name`, `name:port`, `1.2.3.4:port`, `[::1]`, `[::1]:port` (a bare IPv6 address
    /// is taken whole).
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("invalid allowed host {s:?}: expected NAME or NAME:PORT");
        if s.is_empty()
            || s.bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b"/@?#,".contains(&b))
        {
            return Err(bad());
        }
        let (host, port) = split_authority(s).ok_or_else(bad)?;
        Ok(Self {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn matches(&self, host: &str, port: Option<u16>) -> bool {
        self.host.eq_ignore_ascii_case(host) && (self.port.is_none() || self.port == port)
    }
}

/// `host[:port]` → (host, port); a bare IPv6 address (two colons or more) gets brackets.
fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        return Some((format!("[{addr}]"), port));
    }
    if s.matches(':').count() > 1 {
        return Some((format!("[{s}]"), None));
    }
    match s.split_once(':') {
        Some((h, p)) if !h.is_empty() => Some((h.to_owned(), Some(p.parse().ok()?))),
        Some(_) => None,
        None => Some((s.to_owned(), None)),
    }
}

/// The `Host` names a dashboard answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hosts {
    /// Any (authentication is on and no list was given).
    Any,
    /// The loopback names, any port (authentication is off and no list was given). Unlike a
    /// configured list they do not make another origin same-origin: a page served by another
    /// program on `localhost:3000` is another site.
    Loopback,
    /// Only these (configured).
    Only(Vec<HostPattern>),
}

/// The names [`Hosts::Loopback`] answers.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl Hosts {
    /// Whether the request's `Host` (or, in HTTP/2, its URI's authority) is allowed.
    pub(crate) fn allows(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        let host = || request_host(headers, uri).and_then(|h| split_authority(&h));
        match self {
            Hosts::Any => true,
            Hosts::Loopback => {
                host().is_some_and(|(h, _)| LOOPBACK.iter().any(|l| l.eq_ignore_ascii_case(&h)))
            }
            Hosts::Only(list) => {
                host().is_some_and(|(h, p)| list.iter().any(|pat| pat.matches(&h, p)))
            }
        }
    }

    /// Whether `origin_authority` (from an `Origin` header) is one of the configured hosts.
    fn allows_authority(&self, authority: &str, default_port: u16) -> bool {
        match self {
            Hosts::Any | Hosts::Loopback => false,
            Hosts::Only(list) => split_authority(authority).is_some_and(|(h, p)| {
                let p = p.or(Some(default_port));
                list.iter().any(|pat| pat.matches(&h, p))
            }),
        }
    }
}

fn request_host(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
}

/// Why a change must be refused as cross-site, if it must: `Sec-Fetch-Site` other than
/// `same-origin` or `none`, or an `Origin` that is neither the request's own host nor an
/// allowed one. A request with neither header (curl, scripts) is not a browser's and passes.
pub(crate) fn cross_site(headers: &HeaderMap, uri: &Uri, hosts: &Hosts) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        if !matches!(site, "same-origin" | "none") {
            return Some(format!("Sec-Fetch-Site: {site}"));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("null");
    let refused = || Some(format!("Origin: {origin}"));
    let Some((scheme, authority)) = origin.split_once("://") else {
        return refused(); // "null" (sandboxed frames, file: pages, redirects across sites)
    };
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return refused(),
    };
    let Some((oh, op)) = split_authority(authority) else {
        return refused();
    };
    let op = op.unwrap_or(default_port);
    let same = request_host(headers, uri)
        .and_then(|h| split_authority(&h))
        .is_some_and(|(h, p)| h.eq_ignore_ascii_case(&oh) && p.unwrap_or(default_port) == op);
    if same || hosts.allows_authority(authority, default_port) {
        None
    } else {
        refused()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn host_patterns_parse_and_match() {
        let p = HostPattern::parse("Dash.Example.com").unwrap();
        assert!(p.matches("dash.example.com", Some(8080)));
        let p = HostPattern::parse("127.0.0.1:8080").unwrap();
        assert!(p.matches("127.0.0.1", Some(8080)));
        assert!(!p.matches("127.0.0.1", Some(8081)));
        assert!(!p.matches("127.0.0.1", None));
        assert_eq!(HostPattern::parse("[::1]:9").unwrap().host, "[::1]");
        assert_eq!(HostPattern::parse("::1").unwrap().host, "[::1]");
        for bad in ["", "a b", "http://x", "x:port", ":80", "a,b"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
        let uri = Uri::from_static("/");
        let lo = Hosts::Loopback;
        assert!(lo.allows(&headers(&[("host", "localhost:8080")]), &uri));
        assert!(lo.allows(&headers(&[("host", "[::1]:8080")]), &uri));
        assert!(!lo.allows(&headers(&[("host", "evil.example:8080")]), &uri));
        assert!(!lo.allows(&headers(&[]), &uri));
        assert!(Hosts::Any.allows(&headers(&[]), &uri));
    }

    #[test]
    fn cross_site_changes_are_recognised() {
        let uri = Uri::from_static("/");
        let lo = Hosts::Loopback;
        let host = ("host", "127.0.0.1:8080");
        let check = |pairs: &[(&'static str, &str)]| cross_site(&headers(pairs), &uri, &lo);
        assert_eq!(check(&[host]), None);
        assert_eq!(check(&[host, ("origin", "http://127.0.0.1:8080")]), None);
        assert_eq!(check(&[host, ("sec-fetch-site", "same-origin")]), None);
        assert_eq!(check(&[host, ("sec-fetch-site", "none")]), None);
        assert!(check(&[host, ("sec-fetch-site", "cross-site")]).is_some());
        assert!(check(&[host, ("sec-fetch-site", "same-site")]).is_some());
        assert!(check(&[host, ("origin", "https://evil.example")]).is_some());
        assert!(check(&[host, ("origin", "http://127.0.0.1:8081")]).is_some());
        assert!(check(&[host, ("origin", "null")]).is_some());
        // Another loopback name is another origin by default...
        assert!(check(&[host, ("origin", "http://localhost:8080")]).is_some());
        // ...but a configured host passes as origin (a proxy that rewrites Host).
        let listed = Hosts::Only(vec![HostPattern::parse("dash.example").unwrap()]);
        assert_eq!(
            cross_site(
                &headers(&[host, ("origin", "https://dash.example")]),
                &uri,
                &listed
            ),
            None
        );
        // Default ports.
        let h80 = ("host", "dash.example");
        let any = Hosts::Any;
        assert_eq!(
            cross_site(
                &headers(&[h80, ("origin", "http://dash.example")]),
                &uri,
                &any
            ),
            None
        );
        assert_eq!(
            cross_site(
                &headers(&[h80, ("origin", "http://dash.example:80")]),
                &uri,
                &any
            ),
            None
        );
    }
}
