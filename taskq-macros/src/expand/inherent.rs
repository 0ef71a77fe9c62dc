//! The inherent methods of the payload struct: `enqueue_tx`, `enqueue` and the enqueue options
//! (`enqueue_options()` and every `with_*`), so that enqueueing a task needs no `use
//! taskq::Task`. The options are taskq's one list (`taskq::__private::enqueue_options!`, also
//! expanded as `Task`'s provided methods), expanded here once per task type.

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
                C: ::taskq::enqueue::AsConnection + ?::core::marker::Sized,
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

            ::taskq::__private::enqueue_options!([pub] links = "taskq");
        }
    }
}
