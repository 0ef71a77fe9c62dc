//! How the macro names what it generates: the payload struct after the function.

/// `order_export` → `OrderExport`, `r#type` → `Type`, `send_email_v2` → `SendEmailV2`.
pub fn pascal_case(snake: &str) -> String {
    snake
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(first) => first.to_uppercase().chain(c).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}
