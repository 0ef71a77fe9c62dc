//! How the runtime reads a database error, as each driver classifies it (`Handle::classify`).

/// How a database error reads to the runtime, as the driver classifies it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorClass {
    /// The statement's transaction lost to a concurrent one (MySQL's deadlock victim or a
    /// Galera certification failure, SQLite's busy timeout): running it again at once is the
    /// cure.
    pub conflict: bool,
    /// The statement can never succeed as sent, besides the SQLSTATE classes 22, 23, 42 and 45
    /// (MySQL's packet too large, SQLite's `SQLITE_TOOBIG` or a constraint).
    pub refused: bool,
}
