//! A minimal capturing `tracing` subscriber for the tests that assert what is logged (no
//! `tracing-subscriber` needed): every event with its level, message and fields as text, and
//! the name and level of every span.
//!
//! Install it for one thread ([`tracing::subscriber::set_default`], with a current-thread
//! runtime) or for the process ([`Capture::global`]), in a test binary of its own: a
//! subscriber set for one thread while another test's threads register the same callsites can
//! miss events (the callsite interest cache races).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// One captured event.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Its level.
    pub level: tracing::Level,
    /// Its message.
    pub message: String,
    /// Its other fields, as text (`Debug`, or the string itself).
    pub fields: BTreeMap<String, String>,
}

impl Captured {
    /// The field `name`, as text.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Keeps every event and span it sees (clones share them).
#[derive(Clone, Default)]
pub struct Capture {
    events: Arc<Mutex<Vec<Captured>>>,
    spans: Arc<Mutex<Vec<(&'static str, tracing::Level)>>>,
}

impl Capture {
    /// The process-wide capture, installed as the global default the first time.
    pub fn global() -> &'static Capture {
        static CAPTURE: OnceLock<Capture> = OnceLock::new();
        CAPTURE.get_or_init(|| {
            let c = Capture::default();
            tracing::subscriber::set_global_default(c.clone()).expect("no other subscriber");
            c
        })
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Captured> {
        self.events.lock().unwrap().clone()
    }

    /// The name and level of every span so far.
    pub fn spans(&self) -> Vec<(&'static str, tracing::Level)> {
        self.spans.lock().unwrap().clone()
    }

    /// The WARN events whose message contains every one of `words`.
    pub fn warnings(&self, words: &[&str]) -> Vec<Captured> {
        self.events()
            .into_iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .filter(|e| words.iter().all(|w| e.message.contains(w)))
            .collect()
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    fields: BTreeMap<String, String>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            name => {
                self.fields.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            name => {
                self.fields.insert(name.to_owned(), format!("{value:?}"));
            }
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let meta = span.metadata();
        self.spans
            .lock()
            .unwrap()
            .push((meta.name(), *meta.level()));
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message: fields.message,
            fields: fields.fields,
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
