//! Missed-tick policies: what a schedule does with ticks that passed while no worker ran it.

/// Most ticks run after missed ones (`all(N)` allows 1 ..= this).
pub const MAX_CATCH_UP_TICKS: u32 = 1000;

/// A parsed missed-tick policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// `latest`: run the latest missed tick once.
    Latest,
    /// `skip`: run none.
    Skip,
    /// `all(N)`: run each, at most the N latest.
    All(u32),
}

/// Parses `latest`, `skip` or `all(N)` (1 ≤ N ≤ [`MAX_CATCH_UP_TICKS`]).
pub fn parse(s: &str) -> Result<Missed, String> {
    let s = s.trim();
    match s {
        "latest" => return Ok(Missed::Latest),
        "skip" => return Ok(Missed::Skip),
        _ => {}
    }
    let expected = "expected \"latest\" (run the latest missed tick once), \"skip\" (run none) or \"all(N)\" (run each, at most the N latest)";
    let n = s
        .strip_prefix("all(")
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("unknown policy {s:?}: {expected}"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|_| format!("`all(N)` needs a whole number, found {n:?}"))?;
    check_all(n)?;
    Ok(Missed::All(n))
}

/// Checks the `N` of `all(N)`.
pub fn check_all(n: u32) -> Result<(), String> {
    if n == 0 || n > MAX_CATCH_UP_TICKS {
        return Err(format!(
            "`all({n})` is out of range: 1 ..= {MAX_CATCH_UP_TICKS} (use \"skip\" to run none)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies() {
        assert_eq!(parse("latest").unwrap(), Missed::Latest);
        assert_eq!(parse(" skip ").unwrap(), Missed::Skip);
        assert_eq!(parse("all(12)").unwrap(), Missed::All(12));
        assert_eq!(parse("all( 1000 )").unwrap(), Missed::All(1000));
        assert!(parse("all(0)").unwrap_err().contains("out of range"));
        assert!(parse("all(1001)").unwrap_err().contains("out of range"));
        assert!(parse("all(x)").unwrap_err().contains("whole number"));
        assert!(parse("none").unwrap_err().contains("unknown policy"));
    }
}
