//! The inherent methods of the payload struct: `enqueue_tx`, `enqueue` and the `with_*`
//! options, so that enqueueing a task needs no `use taskq::Task`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, Ident};

/// The `impl` block of the payload struct's enqueue helpers.
pub fn generate(ty: &Ident, cfgs: &[&Attribute]) -> TokenStream {
    quote! {
        #(#cfgs)*
        #[allow(dead_code)]
        impl #ty {
            /// Inserts this task on the caller's transaction or connection; it becomes visible
            /// to workers when the caller commits (taskq never begins, commits or rolls back).
            pub async fn enqueue_tx<C>(self, conn: &mut C) -> ::taskq::Result<::taskq::Enqueued>
            where
                C: ::taskq::AsConnection + ?::core::marker::Sized,
            {
                ::taskq::Enqueue::new(self).enqueue_tx(conn).await
            }

            /// Inserts this task on its own (autocommit), outside any caller transaction, on
            /// either backend's pool.
            pub async fn enqueue<DB: ::taskq::Backend>(
                self,
                pool: &::taskq::__private::sqlx::Pool<DB>,
            ) -> ::taskq::Result<::taskq::Enqueued> {
                ::taskq::Enqueue::new(self).enqueue(pool).await
            }

            /// Starts an enqueue with options (delay, run-at, priority, idempotency key, unique,
            /// queue, max attempts, deadline).
            pub fn enqueue_options(self) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self)
            }

            /// Runs no earlier than `delay` after the insert (database clock).
            pub fn with_delay(self, delay: ::core::time::Duration) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_delay(delay)
            }

            /// Runs no earlier than this UTC time.
            pub fn with_run_at(
                self,
                at: ::taskq::__private::chrono::DateTime<::taskq::__private::chrono::Utc>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_run_at(at)
            }

            /// Overrides the task's default priority (lower runs first).
            pub fn with_priority(self, priority: i16) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_priority(priority)
            }

            /// At most one task with this name and key exists while its row is kept; a
            /// duplicate enqueue returns the existing task's id.
            pub fn with_idempotency_key(
                self,
                key: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_idempotency_key(key)
            }

            /// Makes this enqueue unique (or, with `None`, not unique), replacing the task's
            /// `unique` declaration; see `taskq::Unique`.
            pub fn with_unique(
                self,
                unique: impl ::core::convert::Into<::core::option::Option<::taskq::Unique>>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_unique(unique)
            }

            /// Overrides the task's queue.
            pub fn with_queue(
                self,
                queue: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_queue(queue)
            }

            /// Overrides the task's max attempts (at least 1).
            pub fn with_max_attempts(self, n: u32) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_max_attempts(n)
            }

            /// No attempt starts at or after this time: a task not started by then ends
            /// `expired`, never run (replaces `with_ttl` and the task's `ttl`).
            pub fn with_deadline(
                self,
                deadline: ::taskq::__private::chrono::DateTime<::taskq::__private::chrono::Utc>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_deadline(deadline)
            }

            /// The deadline as a time to live from the insert (database clock; replaces
            /// `with_deadline` and the task's `ttl`).
            pub fn with_ttl(self, ttl: ::core::time::Duration) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_ttl(ttl)
            }

            /// Records this trace context instead of asking the trace-context hook.
            pub fn with_trace_context(
                self,
                context: impl ::core::convert::Into<::std::string::String>,
            ) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_trace_context(context)
            }

            /// Overrides the payload size limit for this enqueue.
            pub fn with_payload_limit(self, bytes: usize) -> ::taskq::Enqueue<Self> {
                ::taskq::Enqueue::new(self).with_payload_limit(bytes)
            }
        }
    }
}
