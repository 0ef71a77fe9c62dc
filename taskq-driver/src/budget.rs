//! How many bytes one multi-row statement carries: one rule for `enqueue_many`'s inserts and
//! for the worker's write-backs and reaps with their follow-up rows.
//!
//! A statement, JSON argument included, must fit the server's packet (`max_allowed_packet`:
//! 16 MiB by default on MariaDB, 64 MiB on MySQL 8, as low as 1 KiB if configured so); one
//! that does not is refused whole (error 1153, or the server closes the connection while it is
//! sent), and sending it again fails again. So rows are split into statements of at most
//! [`STATEMENT_BYTES`] (less on a server with a smaller packet), and a row that cannot fit
//! any statement is known before it is sent.

/// Most bytes of JSON rows one statement carries (when the server's packet allows it).
pub const STATEMENT_BYTES: usize = 2 << 20;

/// Room kept in a packet for the statement around its JSON argument.
const PACKET_MARGIN: usize = 16 << 10;

/// SQLite's longest string or blob (`SQLITE_MAX_LENGTH`, its compile-time default): the
/// "packet" of a SQLite statement's JSON argument.
pub const SQLITE_MAX_LENGTH: u64 = 1_000_000_000;

/// The byte limits of one server's multi-row statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes of rows one statement takes before another is started.
    pub statement: usize,
    /// The biggest row that can be sent at all (alone in its statement).
    pub row: usize,
}

impl Budget {
    /// The limits under a server packet of `max_packet` bytes.
    pub fn for_packet(max_packet: u64) -> Self {
        let room = usize::try_from(max_packet)
            .unwrap_or(usize::MAX)
            .saturating_sub(PACKET_MARGIN)
            .max(1024);
        Self {
            statement: STATEMENT_BYTES.min(room),
            row: room,
        }
    }

    /// Splits rows of the given sizes (their bytes in the statement's JSON), in order, into
    /// statements of at most `max_rows` rows whose bytes stay within
    /// [`statement`](Self::statement); a row bigger than that goes alone. Returns the number
    /// of rows of each statement.
    pub fn chunks(&self, sizes: impl IntoIterator<Item = usize>, max_rows: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let (mut rows, mut bytes) = (0usize, 0usize);
        for size in sizes {
            if rows > 0 && (rows >= max_rows || bytes + size > self.statement) {
                out.push(rows);
                (rows, bytes) = (0, 0);
            }
            rows += 1;
            bytes += size;
        }
        if rows > 0 {
            out.push(rows);
        }
        out
    }
}

/// Bytes of `s` as a JSON string (quotes and escapes included), as serde_json writes it.
pub fn json_str_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_stay_within_the_budget_and_a_big_row_goes_alone() {
        let b = Budget {
            statement: 100,
            row: 1000,
        };
        assert_eq!(b.chunks([40, 40, 40, 150, 10, 10], 10), [2, 1, 1, 2]);
        assert_eq!(b.chunks([1; 7], 3), [3, 3, 1]);
        assert!(b.chunks([], 3).is_empty());
        assert_eq!(Budget::for_packet(16 << 20).statement, STATEMENT_BYTES);
        let small = Budget::for_packet(1 << 20);
        assert_eq!(
            (small.statement, small.row),
            ((1 << 20) - PACKET_MARGIN, (1 << 20) - PACKET_MARGIN)
        );
    }

    #[test]
    fn json_string_lengths_match_serde() {
        for s in [
            "",
            "plain",
            "quote \" and \\ back",
            "tab\tnew\nline\u{1}\u{7f}é…",
        ] {
            assert_eq!(
                json_str_len(s),
                serde_json::to_string(s).unwrap().len(),
                "{s:?}"
            );
        }
    }
}
