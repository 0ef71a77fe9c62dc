//! `taskq migrate`: applies taskq's schema migrations.

use crate::connect::Pool;
use crate::failure::Failure;
use crate::render::print_json;

pub async fn migrate(pool: &Pool, json: bool) -> Result<(), Failure> {
    match pool {
        Pool::MySql(p) => taskq::migrate(p).await?,
        Pool::Sqlite(p) => taskq::migrate(p).await?,
    }
    if json {
        print_json(&serde_json::json!({ "migrated": true }));
    } else {
        println!("migrations applied");
    }
    Ok(())
}
