//! Order key derivation: how an ordered task's key is computed (see `taskq::ordered::Ordered`). Written
//! once here; taskq selects the fields from the payload and calls these.
//!
//! The key is a SHA-256 of the queue and the selected payload fields (canonical JSON, as for
//! unique tasks), so different task names of one queue with the same fields share a key; an
//! explicit key given at enqueue hashes the queue and the key text under another prefix, so
//! it never equals a field-derived key.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::unique::canonical_json;

/// The key of the selected payload `fields` (name to value) in `queue`.
pub fn fields_key(queue: &str, fields: Map<String, Value>) -> [u8; 32] {
    let mut material = String::from("taskq.order.v1\0");
    material.push_str(queue);
    material.push('\0');
    canonical_json(&Value::Object(fields), &mut material);
    Sha256::digest(material.as_bytes()).into()
}

/// The key of an explicit order key given at enqueue, in `queue`.
pub fn explicit_key(queue: &str, key: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"taskq.order.v1.key\0");
    h.update(queue.as_bytes());
    h.update(b"\0");
    h.update(key.as_bytes());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_key_is_the_queue_and_the_fields_in_any_order() {
        let a = fields_key(
            "ledger",
            fields(serde_json::json!({"account": 7, "side": "d"})),
        );
        let b = fields_key(
            "ledger",
            fields(serde_json::json!({"side": "d", "account": 7})),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            fields_key(
                "ledger2",
                fields(serde_json::json!({"account": 7, "side": "d"}))
            )
        );
        assert_ne!(
            a,
            fields_key(
                "ledger",
                fields(serde_json::json!({"account": 8, "side": "d"}))
            )
        );
        assert_ne!(explicit_key("ledger", "7"), explicit_key("ledger2", "7"));
        assert_ne!(
            explicit_key("ledger", r#"{"account":7}"#),
            fields_key("ledger", fields(serde_json::json!({"account": 7})))
        );
    }
}
