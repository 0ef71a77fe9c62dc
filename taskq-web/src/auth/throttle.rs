//! Throttling of failed sign-ins (login form and `Authorization` headers): per client and
//! overall, each failure logged at WARN.
//!
//! - **Per client** (its IP address when the server provides it through
//!   `ConnectInfo<SocketAddr>`, as `taskq web` does; otherwise every client shares one
//!   bucket): after [`FREE_FAILURES`] failures within [`WINDOW`] the client is locked out for
//!   [`FIRST_LOCKOUT`], doubling with every further failure up to [`MAX_LOCKOUT`].
//!   While locked out, its attempts are answered 429 without checking the credentials.
//! - **Overall**: more than [`GLOBAL_FAILURES_PER_MINUTE`] failures in a minute, from all clients
//!   together, locks out every client until the minute ends, new addresses included, except
//!   the clients that signed in within [`WINDOW`] and have not failed since. So the
//!   credentials checked for clients that have not signed in are bounded (at most
//!   [`GLOBAL_FAILURES_PER_MINUTE`] + 1 failures a minute, however many addresses they come
//!   from), at the price of refusing a new client during an attack.
//! - **Memory**: at most [`MAX_CLIENTS`] clients with failures in their window are remembered
//!   (and as many that signed in). A client is forgotten only once its window has passed, never
//!   to make room: while the map is full of clients still in their window, a client it holds
//!   no entry for is refused, so an attacker cannot evict a lockout by failing from many
//!   addresses.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures a client may make within [`WINDOW`] before it is locked out.
pub(crate) const FREE_FAILURES: u32 = 5;
/// How long a client's failures (or its sign-in) are remembered after its last one.
pub(crate) const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The first lockout of a client.
pub(crate) const FIRST_LOCKOUT: Duration = Duration::from_secs(5);
/// Longest lockout of one client.
pub(crate) const MAX_LOCKOUT: Duration = Duration::from_secs(300);
/// Failures in one minute, over all clients, past which every client that has not signed in
/// is locked out.
pub(crate) const GLOBAL_FAILURES_PER_MINUTE: u32 = 60;
/// The global lockout's period.
const MINUTE: Duration = Duration::from_secs(60);
/// Most clients with failures remembered (and most clients that signed in).
const MAX_CLIENTS: usize = 10_000;

pub(crate) use crate::ctx::ClientKey;

#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    clients: HashMap<ClientKey, Client>,
    /// Clients that signed in, with when (last); a failure removes the client.
    signed_in: HashMap<ClientKey, Instant>,
    global_window: Option<Instant>,
    global_failures: u32,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    failures: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

impl State {
    /// The end of the global lockout, when one is on at `now`.
    fn global_lockout(&self, now: Instant) -> Option<Instant> {
        let end = self.global_window? + MINUTE;
        (self.global_failures > GLOBAL_FAILURES_PER_MINUTE && end > now).then_some(end)
    }

    /// Whether `client` signed in within the window (and has not failed since).
    fn signed_in(&self, client: &ClientKey, now: Instant) -> bool {
        self.signed_in
            .get(client)
            .is_some_and(|at| now.duration_since(*at) <= WINDOW)
    }

    /// Forgets the clients whose window has passed; whether the map has room for one more.
    fn room(&mut self, now: Instant) -> bool {
        if self.clients.len() < MAX_CLIENTS {
            return true;
        }
        self.clients
            .retain(|_, c| now.duration_since(c.last) <= WINDOW);
        self.clients.len() < MAX_CLIENTS
    }
}

impl Throttle {
    /// `Err(retry after)` when `client` may not try now.
    pub(crate) fn check(&self, client: ClientKey) -> Result<(), Duration> {
        self.check_at(client, Instant::now())
    }

    fn check_at(&self, client: ClientKey, now: Instant) -> Result<(), Duration> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let live = st
            .clients
            .get(&client)
            .filter(|c| now.duration_since(c.last) <= WINDOW)
            .copied();
        if let Some(c) = live
            && let Some(until) = c.locked_until
            && until > now
        {
            return Err(until - now);
        }
        if st.signed_in(&client, now) {
            return Ok(());
        }
        if let Some(end) = st.global_lockout(now) {
            return Err(end - now);
        }
        if live.is_none() && !st.clients.contains_key(&client) && !st.room(now) {
            // Full of clients still in their window: none is forgotten to make room.
            return Err(MINUTE);
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
            Some(start) if now.duration_since(start) < MINUTE => {
                st.global_failures = st.global_failures.saturating_add(1);
            }
            _ => {
                st.global_window = Some(now);
                st.global_failures = 1;
            }
        }
        st.signed_in.remove(&client);
        if !st.clients.contains_key(&client) && !st.room(now) {
            // Counted overall only (a check refuses such a client while the map is full).
            return (1, false);
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

    /// Forgets `client`'s failures (it signed in) and remembers that it did, for the window.
    pub(crate) fn succeeded(&self, client: ClientKey) {
        self.succeeded_at(client, Instant::now())
    }

    fn succeeded_at(&self, client: ClientKey, now: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.clients.remove(&client);
        if st.signed_in.len() >= MAX_CLIENTS && !st.signed_in.contains_key(&client) {
            // Forgetting a sign-in only takes an exemption away: the safe direction.
            st.signed_in
                .retain(|_, at| now.duration_since(*at) <= WINDOW);
            if st.signed_in.len() >= MAX_CLIENTS
                && let Some(oldest) = st
                    .signed_in
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| *k)
            {
                st.signed_in.remove(&oldest);
            }
        }
        st.signed_in.insert(client, now);
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
    fn many_clients_together_lock_out_every_client_for_the_minute() {
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
        assert_eq!(t.check_at(fresh, t0), Err(Duration::from_secs(60)));
        assert_eq!(t.check_at(failing, t0 + Duration::from_secs(60)), Ok(()));
        assert_eq!(t.check_at(fresh, t0 + Duration::from_secs(60)), Ok(()));
    }

    /// Issue 34 W1: during the global lockout a new address gets no checked guess either, so
    /// the checked guesses per minute are bounded whatever the number of addresses; a client
    /// that signed in within the window still signs in.
    #[test]
    fn past_the_global_limit_new_addresses_are_refused_but_signed_in_clients_are_not() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let good: ClientKey = Some(IpAddr::from([192, 0, 2, 50]));
        t.succeeded_at(good, t0);
        let mut checked = 0;
        for i in 0..10_000u32 {
            let ip: ClientKey = Some(IpAddr::from([198, 51, (i / 256) as u8, (i % 256) as u8]));
            if t.check_at(ip, t0).is_ok() {
                checked += 1;
                t.failed_at(ip, t0);
            }
        }
        assert_eq!(checked, GLOBAL_FAILURES_PER_MINUTE + 1);
        let fresh: ClientKey = Some(IpAddr::from([203, 0, 113, 9]));
        assert_eq!(t.check_at(fresh, t0), Err(Duration::from_secs(60)));
        assert_eq!(t.check_at(good, t0), Ok(()));
        assert_eq!(t.check_at(fresh, t0 + Duration::from_secs(60)), Ok(()));
    }

    /// Issue 34 W1: filling the map with other clients does not forget a lockout.
    #[test]
    fn a_full_map_does_not_forget_a_locked_out_client() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let locked: ClientKey = Some(IpAddr::from([192, 0, 2, 1]));
        for _ in 0..FREE_FAILURES + 3 {
            t.failed_at(locked, t0);
        }
        let until = t.check_at(locked, t0).unwrap_err();
        let t1 = t0 + Duration::from_secs(1);
        for i in 0..(MAX_CLIENTS as u32 + 10) {
            let ip: ClientKey = Some(IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]));
            t.failed_at(ip, t1);
        }
        assert_eq!(t.check_at(locked, t1), Err(until - Duration::from_secs(1)));
        // A client the full map holds no entry for is refused rather than let in unrecorded.
        let newcomer: ClientKey = Some(IpAddr::from([203, 0, 113, 7]));
        let t2 = t1 + Duration::from_secs(61);
        assert!(t.check_at(newcomer, t2).is_err());
        // Once the entries age out of the window, there is room again.
        assert_eq!(
            t.check_at(newcomer, t1 + WINDOW + Duration::from_secs(1)),
            Ok(())
        );
    }
}
