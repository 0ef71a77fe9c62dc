//! TEMPORARY (branch `evops`, until the `events` branch's milestone A is merged): the
//! `Event` trait of /work/EVENTS_SPEC.md without `publish_tx`, so `#[taskq::event]` compiles
//! and can be tested. On merge, take the `events` branch's module instead of this file.

/// A domain event: published in the caller's transaction, relayed to a broker in per-key
/// commit order.
pub trait Event: serde::Serialize + Send + Sync {
    /// The subject / topic / routing key / stream it goes to (1..=255 bytes).
    fn topic(&self) -> &str;
    /// The ordering key (an aggregate id), 1..=255 bytes.
    fn key(&self) -> String;
    /// Headers published with it (default none).
    fn headers(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
