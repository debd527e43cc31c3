//! What each writer believes its table holds, and the statements it sends to change it.

use std::collections::BTreeMap;

use weir::rng::Rng;

/// Rows a writer's table grows to before its deletes outpace its inserts.
const ROWS_SOFT_MAX: usize = 2000;

/// One statement a writer sent, and how to tell afterwards whether Weir applied it.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub(super) sql: String,
    pub(super) table: &'static str,
    pub(super) change: Change,
}

#[derive(Debug, Clone)]
pub(super) enum Change {
    Insert(Vec<Row>),
    Delete(Vec<i64>),
    /// Row `id` gets the never-used value `to` in its value column (`v` or `w`).
    Update {
        id: i64,
        to: i64,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) id: i64,
    pub(super) value: i64,
}

/// What one writer believes its table holds: the id and value column of every row. Its rows
/// are the acknowledged ones, and the in-doubt ones once resolved.
pub(super) struct Model {
    pub(super) table: &'static str,
    pub(super) rows: BTreeMap<i64, i64>,
    pub(super) rng: Rng,
    /// Ids and values are never reused, so a row's presence and an update's value tell
    /// whether a statement was applied.
    pub(super) next_id: i64,
    pub(super) next_value: i64,
    /// The largest id the other table has issued: `t2.k` points into `t1`'s ids.
    pub(super) foreign_ids: i64,
}

impl Model {
    pub(super) fn new(table: &'static str, seed: u64) -> Model {
        Model {
            table,
            rows: BTreeMap::new(),
            rng: Rng::new(seed),
            next_id: 1,
            next_value: 1000,
            foreign_ids: 1,
        }
    }

    pub(super) fn fresh_value(&mut self) -> i64 {
        self.next_value += 1 + self.rng.below(3) as i64;
        self.next_value
    }

    pub(super) fn existing(&mut self) -> Option<i64> {
        if self.rows.is_empty() {
            return None;
        }
        let i = self.rng.below(self.rows.len() as u64) as usize;
        self.rows.keys().nth(i).copied()
    }

    pub(super) fn next(&mut self) -> Statement {
        let roll = self.rng.below(100);
        let table = self.table;
        // A bounded table keeps every round about as fast as the first, however long the run:
        // past ROWS_SOFT_MAX rows, fewer inserts and longer deletes shrink it.
        let large = self.rows.len() > ROWS_SOFT_MAX;
        let (insert_below, update_below) = if large { (25, 60) } else { (55, 80) };
        if roll < insert_below || self.rows.len() < 5 {
            let n = 1 + self.rng.below(4) as usize;
            let mut rows = Vec::new();
            let mut values = Vec::new();
            for _ in 0..n {
                let id = self.next_id;
                self.next_id += 1;
                let (value, text) = if table == "t1" {
                    let value = self.fresh_value();
                    let g = self.rng.below(7);
                    let n = format!("{}.{:02}", self.rng.below(1000), self.rng.below(100));
                    let s = ["'a'", "'b'", "'c'", "'dd'", "NULL"][self.rng.below(5) as usize];
                    (value, format!("({id}, {g}, {value}, {n}, {s})"))
                } else {
                    let value = self.rng.below(100) as i64;
                    let k = 1 + self.rng.below(self.foreign_ids.max(1) as u64 + 3) as i64;
                    (value, format!("({id}, {k}, {value})"))
                };
                rows.push(Row { id, value });
                values.push(text);
            }
            return Statement {
                sql: format!("INSERT INTO {table} VALUES {}", values.join(", ")),
                table,
                change: Change::Insert(rows),
            };
        }
        let column = if table == "t1" { "v" } else { "w" };
        let id = self.existing().unwrap_or(0);
        if roll < update_below {
            let to = self.fresh_value();
            let also = if table == "t1" && self.rng.chance(50) {
                format!(", g = {}", self.rng.below(7))
            } else {
                String::new()
            };
            return Statement {
                sql: format!("UPDATE {table} SET {column} = {to}{also} WHERE id = {id}"),
                table,
                change: Change::Update { id, to },
            };
        }
        let mut ids = vec![id];
        let more = if large {
            1 + self.rng.below(4)
        } else {
            u64::from(self.rng.chance(30))
        };
        for _ in 0..more {
            if let Some(other) = self.existing().filter(|o| !ids.contains(o)) {
                ids.push(other);
            }
        }
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        Statement {
            sql: format!("DELETE FROM {table} WHERE id IN ({})", list.join(", ")),
            table,
            change: Change::Delete(ids),
        }
    }

    pub(super) fn apply(&mut self, change: &Change) {
        match change {
            Change::Insert(rows) => {
                for r in rows {
                    self.rows.insert(r.id, r.value);
                }
            }
            Change::Delete(ids) => {
                for id in ids {
                    self.rows.remove(id);
                }
            }
            Change::Update { id, to } => {
                self.rows.insert(*id, *to);
            }
        }
    }
}
