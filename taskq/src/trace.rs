//! Trace propagation from the enqueuing request to the handler.
//!
//! taskq does not depend on OpenTelemetry. Instead, the producer side records a trace context
//! string (normally a W3C `traceparent`) in the task row, and the worker hands it back:
//! - at enqueue, [`set_trace_context_hook`] is asked for the current context (or pass one
//!   with [`Enqueue::with_trace_context`](crate::Enqueue::with_trace_context));
//! - in the worker, the `taskq.task` span records it as the `trace_context` field, the handler
//!   reads it with [`TaskContext::trace_context`](crate::TaskContext::trace_context), and
//!   [`WorkerBuilder::trace_link`](crate::worker::WorkerBuilder::trace_link) lets you link the span to
//!   it (with `tracing-opentelemetry`: extract the context and call `span.add_link(..)` or
//!   `span.set_parent(..)`).
//!
//! With OpenTelemetry the producer hook is typically:
//! ```ignore
//! taskq::settings::set_trace_context_hook(|| {
//!     use opentelemetry::propagation::TextMapPropagator;
//!     use tracing_opentelemetry::OpenTelemetrySpanExt;
//!     let mut carrier = std::collections::HashMap::new();
//!     opentelemetry_sdk::propagation::TraceContextPropagator::new()
//!         .inject_context(&tracing::Span::current().context(), &mut carrier);
//!     carrier.remove("traceparent")
//! });
//! ```

use std::sync::OnceLock;

/// Longest trace context stored (the column is `VARCHAR(512)`); longer ones are dropped.
pub const MAX_TRACE_CONTEXT_LEN: usize = 512;

type Hook = Box<dyn Fn() -> Option<String> + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs the process-wide function that returns the current trace context at enqueue time.
/// Can be set once; returns `false` if a hook was already installed.
pub fn set_trace_context_hook(hook: impl Fn() -> Option<String> + Send + Sync + 'static) -> bool {
    HOOK.set(Box::new(hook)).is_ok()
}

/// The context to store: the explicit one, else the hook's; dropped when empty or too long.
pub(crate) fn capture(explicit: Option<String>) -> Option<String> {
    let ctx = explicit.or_else(|| HOOK.get().and_then(|h| h()))?;
    if ctx.is_empty() || ctx.len() > MAX_TRACE_CONTEXT_LEN || ctx.chars().any(char::is_control) {
        tracing::debug!(
            len = ctx.len(),
            "taskq: trace context dropped (empty, too long or control characters)"
        );
        return None;
    }
    Some(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_context_is_kept_and_bad_ones_dropped() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned();
        assert_eq!(capture(Some(tp.clone())), Some(tp));
        assert_eq!(capture(Some(String::new())), None);
        assert_eq!(capture(Some("x".repeat(513))), None);
        assert_eq!(capture(Some("a\nb".into())), None);
    }
}
