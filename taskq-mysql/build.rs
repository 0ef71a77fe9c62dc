//! Rebuilds taskq-mysql when a migration is added or changed: `sqlx::migrate!` embeds the files of
//! `migrations/` at compile time but does not tell cargo to watch that directory.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
