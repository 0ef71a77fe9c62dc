// `#[taskq::event]` expands without warnings under strict lints, on public and private structs,
// with the derive before or after it, one or several key fields, raw identifiers and generics;
// and the generated `topic()` / `key()` are what the attribute says.
#![forbid(unsafe_code)]
#![deny(warnings, missing_docs, unreachable_pub)]
//! A binary that defines events.

use std::fmt;

use taskq::outbox::Event;

/// Events of this binary.
pub mod events {
    /// An order was placed.
    #[derive(serde::Serialize)]
    #[taskq::event(topic = "orders.placed", key = order_id)]
    pub struct OrderPlaced {
        /// The order.
        pub order_id: i64,
        /// Its total.
        pub total_cents: i64,
    }

    /// A tenant's order was shipped (the attribute before the derive; a trailing comma).
    #[taskq::event(topic = "orders.shipped", key = [tenant, order_id],)]
    #[derive(serde::Serialize, Debug, Clone)]
    pub struct OrderShipped {
        /// The tenant.
        pub tenant: String,
        /// The order.
        pub order_id: u64,
    }
}

/// A key type of the application's own, displayed its own way.
#[derive(serde::Serialize)]
struct AccountId(u32);

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "acct-{}", self.0)
    }
}

#[derive(serde::Serialize)]
#[taskq::event(topic = "ledger.posted", key = [r#type, account])]
struct Posted<T: serde::Serialize + Send + Sync + fmt::Display> {
    r#type: T,
    account: AccountId,
    amount: i64,
}

#[derive(serde::Serialize)]
#[taskq::event(topic = "a.b", key = id)]
struct Refs<'a> {
    id: &'a str,
}

fn takes_event(e: &impl Event) -> (String, String) {
    (e.topic().to_owned(), e.key())
}

fn main() {
    let placed = events::OrderPlaced {
        order_id: 42,
        total_cents: 1999,
    };
    assert_eq!(takes_event(&placed), ("orders.placed".into(), "42".into()));
    assert!(placed.headers().is_empty());
    let _ = placed.total_cents;

    let shipped = events::OrderShipped {
        tenant: "acme".into(),
        order_id: 7,
    };
    assert_eq!(
        takes_event(&shipped.clone()),
        ("orders.shipped".into(), "acme:7".into())
    );

    let posted = Posted {
        r#type: 'd',
        account: AccountId(9),
        amount: -5,
    };
    let _ = posted.amount;
    assert_eq!(
        takes_event(&posted),
        ("ledger.posted".into(), "d:acct-9".into())
    );

    let id = String::from("x");
    assert_eq!(takes_event(&Refs { id: &id }).1, "x");
}
