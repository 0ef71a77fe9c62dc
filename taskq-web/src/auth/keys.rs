//! The dashboard's secrets: the keys that sign session cookies and CSRF tokens, derived from a
//! random (or configured) secret and the credentials, and the sessions ended before their
//! expiry (logout).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::ctx::Session;

/// Fewest bytes a configured session secret may have.
pub(crate) const MIN_SECRET_LEN: usize = 32;
/// Most ended-but-unexpired sessions remembered; past it every session ends (the safe side).
const MAX_REVOKED: usize = 100_000;
/// How far in the future a session's issue time may lie (clock skew between replicas).
const ISSUE_SKEW_SECS: u64 = 60;

/// Keys of one dashboard: a session key and a CSRF key, both HMAC-SHA256 keys derived from the
/// secret and the credentials (changing either ends every session and invalidates every form).
pub(crate) struct Keys {
    session: [u8; 32],
    csrf: [u8; 32],
    ttl: Duration,
    revoked: Mutex<Revoked>,
}

#[derive(Default)]
struct Revoked {
    /// Ended session ids and when they would have expired.
    ids: HashMap<String, u64>,
    /// Sessions issued before this unix second are ended (set when `ids` overflows).
    not_before: u64,
}

impl Keys {
    /// Keys from `secret` (random when `None`) and the credentials (`parts`).
    pub(crate) fn new(secret: Option<&[u8]>, parts: &[&str], ttl: Duration) -> Self {
        let random;
        let secret = match secret {
            Some(s) => s,
            None => {
                random = random_bytes();
                &random[..]
            }
        };
        let mut material = Vec::new();
        for part in parts {
            material.extend_from_slice(&(part.len() as u64).to_be_bytes());
            material.extend_from_slice(part.as_bytes());
        }
        let root = hmac(secret, &material);
        Self {
            session: hmac(&root, b"taskq-web session v2"),
            csrf: hmac(&root, b"taskq-web csrf v2"),
            ttl,
            revoked: Mutex::new(Revoked::default()),
        }
    }

    /// A new session cookie value: `<id>.<issued unix seconds>.<HMAC of both>`.
    pub(crate) fn new_session(&self) -> String {
        let msg = format!("{}.{}", hex(&random_bytes()[..16]), unix_now());
        format!("{msg}.{}", hex(&hmac(&self.session, msg.as_bytes())))
    }

    /// The session a cookie value names, if its MAC is right, it was issued no earlier than
    /// the lifetime ago (and not in the future), and it was not ended.
    pub(crate) fn check_session(&self, value: &str) -> Option<Session> {
        let (msg, mac) = value.rsplit_once('.')?;
        let (id, issued) = msg.split_once('.')?;
        let expected = hex(&hmac(&self.session, msg.as_bytes()));
        if !ct_eq(mac.as_bytes(), expected.as_bytes()) {
            return None;
        }
        let issued: u64 = issued.parse().ok()?;
        let now = unix_now();
        let expires = issued.saturating_add(self.ttl.as_secs());
        if issued > now + ISSUE_SKEW_SECS || expires <= now {
            return None;
        }
        let revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        if issued < revoked.not_before || revoked.ids.contains_key(id) {
            return None;
        }
        Some(Session {
            id: id.to_owned(),
            expires,
        })
    }

    /// Ends `session` in this process (logout).
    pub(crate) fn end_session(&self, session: &Session) {
        let now = unix_now();
        let mut r = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        r.ids.retain(|_, expires| *expires > now);
        if r.ids.len() >= MAX_REVOKED {
            r.ids.clear();
            r.not_before = now + 1;
        }
        r.ids.insert(session.id.clone(), session.expires);
    }

    /// The CSRF token of forms served to a request bound to `binding` (the session id, or the
    /// credential that authenticated it) with CSRF cookie `nonce`. Someone who can set the
    /// cookie cannot make the matching token without the key.
    pub(crate) fn csrf_token(&self, binding: &str, nonce: &str) -> String {
        let msg = format!("{binding}\0{nonce}");
        hex(&hmac(&self.csrf, msg.as_bytes()))
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Constant-time equality of two byte strings of any lengths (compares their SHA-256 digests,
/// so neither the length nor the first differing byte shows in the timing).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// HMAC-SHA256 (RFC 2104) with a key of any length.
pub(crate) fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in block.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 random bytes from the operating system.
pub(crate) fn random_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the operating system provides random bytes");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: Option<&[u8]>, token: &str) -> Keys {
        Keys::new(secret, &[token], Duration::from_secs(60))
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn sessions_check_their_mac_lifetime_and_logout() {
        let a = keys(None, "token-123");
        let s = a.new_session();
        let session = a.check_session(&s).expect("a fresh session checks out");
        assert!(a.check_session(&s.replace('.', ".0")).is_none());
        // Another process without the same secret, or the same secret with other credentials,
        // does not accept it.
        assert!(keys(None, "token-123").check_session(&s).is_none());
        let secret = [7u8; 32];
        let b = keys(Some(&secret), "token-123");
        let sb = b.new_session();
        assert!(
            keys(Some(&secret), "token-123")
                .check_session(&sb)
                .is_some()
        );
        assert!(
            keys(Some(&secret), "token-124")
                .check_session(&sb)
                .is_none()
        );
        // An issue time in the far future or past is refused even with a right MAC.
        for issued in [unix_now() + 3600, unix_now() - 61, 4_102_444_800] {
            let msg = format!("00112233445566778899aabbccddeeff.{issued}");
            let forged = format!("{msg}.{}", hex(&hmac(&b.session, msg.as_bytes())));
            assert!(b.check_session(&forged).is_none(), "issued {issued}");
        }
        // Logout ends it; another session lives on.
        let other = a.new_session();
        a.end_session(&session);
        assert!(a.check_session(&s).is_none());
        assert!(a.check_session(&other).is_some());
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
    }

    #[test]
    fn csrf_tokens_are_bound_to_the_nonce_the_binding_and_the_key() {
        let a = keys(None, "token-123");
        let t = a.csrf_token("session:1", "nonce");
        assert_eq!(t, a.csrf_token("session:1", "nonce"));
        assert_ne!(t, a.csrf_token("session:2", "nonce"));
        assert_ne!(t, a.csrf_token("session:1", "nonce2"));
        assert_ne!(t, keys(None, "token-123").csrf_token("session:1", "nonce"));
    }
}
