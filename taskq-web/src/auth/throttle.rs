//! Throttling of failed sign-ins (login form and `Authorization` headers): per client and
//! overall, each failure logged at WARN.
//!
//! - **Per client** (its IP address when the server provides it through
//!   `ConnectInfo<SocketAddr>`, as `taskq web` does; otherwise every client shares one
//!   bucket): after [`FREE_FAILURES`] failures within [`WINDOW`] the client is locked out for
//!   [`FIRST_LOCKOUT`], doubling with every further failure up to [`MAX_LOCKOUT`].
//!   While locked out, its attempts are answered 429 without checking the credentials.
//! - **Overall**: more than [`GLOBAL_FAILURES_PER_MINUTE`] failures in a minute, from all clients
//!   together, locks out every client with a failure in the window until the minute ends, so
//!   many addresses do not multiply the guesses; clients without failures still sign in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures a client may make within [`WINDOW`] before it is locked out.
pub(crate) const FREE_FAILURES: u32 = 5;
/// How long a client's failures are remembered after its last one.
pub(crate) const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The first lockout of a client.
pub(crate) const FIRST_LOCKOUT: Duration = Duration::from_secs(5);
/// Longest lockout of one client.
pub(crate) const MAX_LOCKOUT: Duration = Duration::from_secs(300);
/// Failures in one minute, over all clients, past which every failing client is locked out.
pub(crate) const GLOBAL_FAILURES_PER_MINUTE: u32 = 60;
/// Most clients remembered (the oldest are forgotten past it).
const MAX_CLIENTS: usize = 10_000;

pub(crate) use crate::ctx::ClientKey;

#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    clients: HashMap<ClientKey, Client>,
    global_window: Option<Instant>,
    global_failures: u32,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    failures: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

impl Throttle {
    /// `Err(retry after)` when `client` may not try now.
    pub(crate) fn check(&self, client: ClientKey) -> Result<(), Duration> {
        self.check_at(client, Instant::now())
    }

    fn check_at(&self, client: ClientKey, now: Instant) -> Result<(), Duration> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = st.clients.get(&client) else {
            return Ok(());
        };
        if now.duration_since(c.last) > WINDOW {
            return Ok(());
        }
        if let Some(until) = c.locked_until
            && until > now
        {
            return Err(until - now);
        }
        if st.global_failures > GLOBAL_FAILURES_PER_MINUTE
            && let Some(start) = st.global_window
        {
            let end = start + Duration::from_secs(60);
            if end > now {
                return Err(end - now);
            }
        }
        Ok(())
    }

    /// Records a failed attempt of `client`; returns its failures in the window and whether it
    /// is now locked out.
    pub(crate) fn failed(&self, client: ClientKey) -> (u32, bool) {
        self.failed_at(client, Instant::now())
    }

    fn failed_at(&self, client: ClientKey, now: Instant) -> (u32, bool) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.global_window {
            Some(start) if now.duration_since(start) < Duration::from_secs(60) => {
                st.global_failures += 1;
            }
            _ => {
                st.global_window = Some(now);
                st.global_failures = 1;
            }
        }
        if st.clients.len() >= MAX_CLIENTS && !st.clients.contains_key(&client) {
            st.clients
                .retain(|_, c| now.duration_since(c.last) <= WINDOW);
            if st.clients.len() >= MAX_CLIENTS
                && let Some(oldest) = st
                    .clients
                    .iter()
                    .min_by_key(|(_, c)| c.last)
                    .map(|(k, _)| *k)
            {
                st.clients.remove(&oldest);
            }
        }
        let c = st.clients.entry(client).or_insert(Client {
            failures: 0,
            last: now,
            locked_until: None,
        });
        if now.duration_since(c.last) > WINDOW {
            c.failures = 0;
            c.locked_until = None;
        }
        c.failures += 1;
        c.last = now;
        let locked = c.failures >= FREE_FAILURES;
        if locked {
            let doublings = (c.failures - FREE_FAILURES).min(16);
            let lockout = (FIRST_LOCKOUT * (1u32 << doublings)).min(MAX_LOCKOUT);
            c.locked_until = Some(now + lockout);
        }
        (c.failures, locked)
    }

    /// Forgets `client`'s failures (it signed in).
    pub(crate) fn succeeded(&self, client: ClientKey) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.clients.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn a_client_is_locked_out_after_its_free_failures_with_doubling_lockouts() {
        let t = Throttle::default();
        let ip: ClientKey = Some("192.0.2.1".parse().unwrap());
        let other: ClientKey = Some("192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        for i in 1..FREE_FAILURES {
            assert_eq!(t.check_at(ip, t0), Ok(()));
            assert_eq!(t.failed_at(ip, t0), (i, false));
        }
        assert_eq!(t.failed_at(ip, t0), (FREE_FAILURES, true));
        assert_eq!(t.check_at(ip, t0), Err(FIRST_LOCKOUT));
        assert_eq!(t.check_at(other, t0), Ok(()));
        let t1 = t0 + FIRST_LOCKOUT;
        assert_eq!(t.check_at(ip, t1), Ok(()));
        t.failed_at(ip, t1);
        assert_eq!(t.check_at(ip, t1), Err(FIRST_LOCKOUT * 2));
        // Capped.
        for _ in 0..20 {
            t.failed_at(ip, t1);
        }
        assert_eq!(t.check_at(ip, t1), Err(MAX_LOCKOUT));
        // Forgotten after the window; a success forgets at once.
        assert_eq!(t.check_at(ip, t1 + WINDOW + Duration::from_secs(1)), Ok(()));
        t.succeeded(ip);
        assert_eq!(t.check_at(ip, t1), Ok(()));
    }

    #[test]
    fn many_clients_together_lock_out_every_failing_client_for_the_minute() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..=GLOBAL_FAILURES_PER_MINUTE {
            let ip: ClientKey = Some(IpAddr::from([198, 51, (i / 256) as u8, (i % 256) as u8]));
            assert_eq!(t.check_at(ip, t0), Ok(()), "client {i}");
            t.failed_at(ip, t0);
        }
        let failing: ClientKey = Some(IpAddr::from([198, 51, 0, 0]));
        let fresh: ClientKey = Some(IpAddr::from([203, 0, 113, 9]));
        assert_eq!(t.check_at(failing, t0), Err(Duration::from_secs(60)));
        assert_eq!(t.check_at(fresh, t0), Ok(()));
        assert_eq!(t.check_at(failing, t0 + Duration::from_secs(60)), Ok(()));
    }
}
