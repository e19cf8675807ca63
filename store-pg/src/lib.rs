//! sandkeeper's fleet store on PostgreSQL: [`PgStore`], a
//! [`FleetStore`](sandkeeper_tokio::store::FleetStore) whose process leases, key entries
//! (owner, fencing token, durable record, wants) and incarnation counter live in a PostgreSQL
//! database that every process of a fleet reaches, on whatever host.
//!
//! - `migrations/`: the schema (schema `sandkeeper_fleet`: tables `process` and `key_entry`, the
//!   sequences `incarnation` and `token`, one function per operation), embedded and applied at
//!   connect under an advisory lock ([`schema`]).
//! - [`PgStore`]: the operations, each one statement calling one function, on one connection
//!   made again after it broke, each bounded in time ([`Timeouts`]).
//! - [`Inventory`] and [`PgStore::sweep`]: the sweep as a composition of this store (leases,
//!   records) and the host's backend (the sandboxes); [`LocalRootInventory`], that of a
//!   local root (a host's `LocalBackend`); [`ShelfInventory`], that of the snapshots the
//!   hosts put in object storage; [`Inventories`] and [`HostInventory`], a host's as one (the
//!   latter telling its copies of what the shelf keeps apart, for [`PgStore::sweep_own`]).
//! - [`throwaway`]: a test aid, a throwaway cluster in a temporary directory.
//!
//! `docs/fleet-postgres.md` has the design, the transactions and why each keeps the store
//! contract, the timeouts and their measured bound, and the figures.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
pub mod hosts;
mod local_root;
pub mod schema;
mod shelf_inventory;
mod store;
mod sweep;
pub mod throwaway;
mod tls;

pub use error::PgError;
pub use local_root::LocalRootInventory;
pub use shelf_inventory::{HostInventory, Inventories, ShelfInventory};
pub use store::{PgStore, Timeouts};
pub use sweep::{Inventory, InventoryFuture};
pub use tls::StoreTls;
