//! The Nexmark connector: the person, auction and bid streams of the Nexmark benchmark, from
//! the `nexmark` crate's generator (the one RisingWave uses), built straight into Arrow
//! batches.
//!
//! Each event is a function of its number alone (the generator seeds each event's random
//! numbers with it), and the first event's time is fixed, so a source is the same stream on
//! every run and can start again at any offset. Event time advances 0.1 ms per event of the
//! whole sequence (10 000 events per second of event time), from 2015-07-15 00:00:00 UTC.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use nexmark::config::NexmarkConfig;
use nexmark::event::{Event, EventType};
use nexmark::EventGenerator;

use super::{Keep, Options, Start};
use crate::catalog::{ColumnDef, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Batches, Splits, FEED_ROWS_MAX};
use crate::types::SqlType;

/// The first event's time: 2015-07-15 00:00:00 UTC, in milliseconds (the date the Flink
/// peer's data sets start at too).
pub const BASE_TIME_MS: u64 = 1_436_918_400_000;

/// `connector = 'nexmark'`: `stream` names the stream; `events` ends it after that many
/// events of the whole sequence (none: it never ends); `events_per_second` paces it.
pub struct Nexmark;

/// A Nexmark source's options.
struct Config {
    stream: String,
    events: Option<u64>,
    events_per_second: Option<u64>,
}

impl Config {
    fn read(options: &mut Options) -> Result<Config> {
        let stream = options
            .take("stream")
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    "a nexmark source needs a stream",
                )
                .with_hint("Add stream = 'person', 'auction' or 'bid'.")
            })?
            .to_lowercase();
        event_type(&stream)?;
        Ok(Config {
            stream,
            events: super::count("events", options.take("events"))?,
            events_per_second: super::count(
                "events_per_second",
                options.take("events_per_second"),
            )?
            .filter(|r| *r > 0),
        })
    }

    fn options(&self) -> BTreeMap<String, String> {
        let mut kept = BTreeMap::from([("stream".to_string(), self.stream.clone())]);
        if let Some(n) = self.events {
            kept.insert("events".into(), n.to_string());
        }
        if let Some(n) = self.events_per_second {
            kept.insert("events_per_second".into(), n.to_string());
        }
        kept
    }
}

impl super::Connector for Nexmark {
    fn name(&self) -> &'static str {
        "nexmark"
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        super::sources_only("nexmark", table)?;
        let config = Config::read(options)?;
        let expected = columns(&config.stream)?;
        let same = declared.len() == expected.len()
            && declared
                .iter()
                .zip(&expected)
                .all(|(d, e)| d.name == e.name && d.ty.to_arrow() == e.ty.to_arrow());
        if !declared.is_empty() && !same {
            let list: Vec<String> = expected
                .iter()
                .map(|c| format!("{} {}", c.name, c.ty))
                .collect();
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!(
                    "the columns of nexmark stream \"{}\" are not those declared",
                    config.stream
                ),
            )
            .with_detail(format!("They are ({}).", list.join(", ")))
            .with_hint("Declare exactly those columns, or none."));
        }
        Ok((config.options(), expected))
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        _keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let mut reader =
            NexmarkReader::open(&config.stream, config.events, start.rows, def.schema())?;
        reader.events_per_second = config.events_per_second;
        Ok(Box::new(reader))
    }
}

/// Writes `stream`'s events among the first `events` of the whole sequence to `out` as
/// newline-delimited JSON, one object per event with the stream's columns (timestamps in
/// ISO 8601, UTC): the events a Nexmark source of the same stream and count reads, for a
/// Kafka topic or a file (`weir nexmark`). Returns the events written.
pub fn write_json(stream: &str, events: u64, out: impl std::io::Write) -> Result<u64> {
    let schema = crate::catalog::columns_schema(&columns(stream)?);
    let mut reader = NexmarkReader::open(stream, Some(events), 0, schema)?;
    let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(out);
    let mut written = 0;
    while let Some(batch) = reader.read(FEED_ROWS_MAX)? {
        written += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    writer.finish()?;
    Ok(written)
}

fn event_type(stream: &str) -> Result<EventType> {
    match stream {
        "person" => Ok(EventType::Person),
        "auction" => Ok(EventType::Auction),
        "bid" => Ok(EventType::Bid),
        other => Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("nexmark has no stream \"{other}\""),
        )
        .with_hint("Use stream = 'person', 'auction' or 'bid'.")),
    }
}

/// The columns of a stream, as in the Nexmark benchmark (and RisingWave's Nexmark sources).
pub fn columns(stream: &str) -> Result<Vec<ColumnDef>> {
    use SqlType::{BigInt, Timestamp};
    let text = SqlType::Varchar { max_chars: None };
    let names: &[(&str, SqlType)] = match event_type(stream)? {
        EventType::Person => &[
            ("id", BigInt),
            ("name", text),
            ("email_address", text),
            ("credit_card", text),
            ("city", text),
            ("state", text),
            ("date_time", Timestamp),
            ("extra", text),
        ],
        EventType::Auction => &[
            ("id", BigInt),
            ("item_name", text),
            ("description", text),
            ("initial_bid", BigInt),
            ("reserve", BigInt),
            ("date_time", Timestamp),
            ("expires", Timestamp),
            ("seller", BigInt),
            ("category", BigInt),
            ("extra", text),
        ],
        EventType::Bid => &[
            ("auction", BigInt),
            ("bidder", BigInt),
            ("price", BigInt),
            ("channel", text),
            ("url", text),
            ("date_time", Timestamp),
            ("extra", text),
        ],
    };
    Ok(names
        .iter()
        .map(|(name, ty)| ColumnDef {
            name: name.to_string(),
            ty: *ty,
            not_null: true,
        })
        .collect())
}

pub struct NexmarkReader {
    generator: EventGenerator,
    /// Events of the whole sequence to go through; `None`: no end.
    events: Option<u64>,
    events_per_second: Option<u64>,
    schema: SchemaRef,
}

impl NexmarkReader {
    /// A reader of `stream` whose first row is the stream's `offset`-th event.
    pub fn open(
        stream: &str,
        events: Option<u64>,
        offset: u64,
        schema: SchemaRef,
    ) -> Result<NexmarkReader> {
        let config = NexmarkConfig {
            base_time: BASE_TIME_MS,
            ..Default::default()
        };
        let generator = EventGenerator::new(config)
            .with_type_filter(event_type(stream)?)
            .with_offset(offset);
        Ok(NexmarkReader {
            generator,
            events,
            events_per_second: None,
            schema,
        })
    }

    fn ended(&self) -> bool {
        self.events
            .is_some_and(|n| self.generator.global_offset() >= n)
    }
}

#[async_trait::async_trait]
impl Batches for NexmarkReader {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        self.read(FEED_ROWS_MAX)
    }
}

impl super::Reader for NexmarkReader {
    /// The generator resumes at an event number, which the source's offset is.
    fn splits(&self) -> Option<Splits> {
        None
    }

    fn pace(&self) -> Option<(u64, u64)> {
        self.events_per_second
            .map(|rate| (rate, self.generator.global_offset()))
    }
}

impl NexmarkReader {
    fn read(&mut self, rows_max: usize) -> Result<Option<RecordBatch>> {
        if self.ended() {
            return Ok(None);
        }
        let mut columns = Columns::new(&self.schema, rows_max);
        while columns.rows < rows_max && !self.ended() {
            match self.generator.next() {
                Some(event) => columns.push(event),
                None => break,
            }
        }
        Ok(Some(RecordBatch::try_new(
            self.schema.clone(),
            columns.finish(),
        )?))
    }
}

/// One builder per column, in the stream's column order.
enum Builder {
    Int(Int64Builder),
    Text(StringBuilder),
    Time(TimestampMicrosecondBuilder),
}

struct Columns {
    builders: Vec<Builder>,
    /// The column the next value goes to.
    at: usize,
    rows: usize,
}

impl Columns {
    fn new(schema: &SchemaRef, capacity: usize) -> Columns {
        let builders = schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Int64 => Builder::Int(Int64Builder::with_capacity(capacity)),
                DataType::Timestamp(..) => {
                    Builder::Time(TimestampMicrosecondBuilder::with_capacity(capacity))
                }
                _ => Builder::Text(StringBuilder::with_capacity(capacity, capacity * 32)),
            })
            .collect();
        Columns {
            builders,
            at: 0,
            rows: 0,
        }
    }

    fn int(&mut self, v: usize) {
        if let Builder::Int(b) = &mut self.builders[self.at] {
            b.append_value(v as i64);
        }
        self.at += 1;
    }

    fn text(&mut self, v: &str) {
        if let Builder::Text(b) = &mut self.builders[self.at] {
            b.append_value(v);
        }
        self.at += 1;
    }

    fn time(&mut self, ms: u64) {
        if let Builder::Time(b) = &mut self.builders[self.at] {
            b.append_value(ms as i64 * 1000);
        }
        self.at += 1;
    }

    fn push(&mut self, event: Event) {
        self.at = 0;
        match event {
            Event::Person(p) => {
                self.int(p.id);
                self.text(&p.name);
                self.text(&p.email_address);
                self.text(&p.credit_card);
                self.text(&p.city);
                self.text(&p.state);
                self.time(p.date_time);
                self.text(&p.extra);
            }
            Event::Auction(a) => {
                self.int(a.id);
                self.text(&a.item_name);
                self.text(&a.description);
                self.int(a.initial_bid);
                self.int(a.reserve);
                self.time(a.date_time);
                self.time(a.expires);
                self.int(a.seller);
                self.int(a.category);
                self.text(&a.extra);
            }
            Event::Bid(b) => {
                self.int(b.auction);
                self.int(b.bidder);
                self.int(b.price);
                self.text(&b.channel);
                self.text(&b.url);
                self.time(b.date_time);
                self.text(&b.extra);
            }
        }
        self.rows += 1;
    }

    fn finish(self) -> Vec<ArrayRef> {
        self.builders
            .into_iter()
            .map(|b| -> ArrayRef {
                match b {
                    Builder::Int(mut b) => Arc::new(b.finish()),
                    Builder::Text(mut b) => Arc::new(b.finish()),
                    Builder::Time(mut b) => Arc::new(b.finish()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    fn reader(stream: &str, events: Option<u64>, offset: u64) -> NexmarkReader {
        let schema = crate::catalog::columns_schema(&columns(stream).unwrap());
        NexmarkReader::open(stream, events, offset, schema).unwrap()
    }

    #[test]
    fn a_stream_starts_again_at_any_offset_and_ends_at_its_share_of_events() {
        let mut whole = reader("bid", Some(1000), 0);
        let mut rows = Vec::new();
        while let Some(b) = whole.read(100).unwrap() {
            rows.push(b);
        }
        let all = datafusion::arrow::compute::concat_batches(&rows[0].schema(), &rows).unwrap();
        // 46 of every 50 events are bids.
        assert_eq!(all.num_rows(), 920);
        let mut later = reader("bid", Some(1000), 500);
        let rest = later.read(10_000).unwrap().unwrap();
        assert_eq!(rest.num_rows(), 420);
        assert_eq!(rest, all.slice(500, 420));
        let auctions = all.column(0).as_primitive::<Int64Type>();
        assert!(auctions.values().iter().all(|a| *a >= 1000));
        let times = all
            .column(5)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        // The first bid is event 4, 0.4 ms after the first event.
        assert_eq!(times.value(0) / 1000, BASE_TIME_MS as i64);
        assert!(times.values().windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn the_json_events_are_those_a_source_reads() {
        for stream in ["person", "auction", "bid"] {
            let mut json = Vec::new();
            let written = write_json(stream, 3000, &mut json).unwrap();
            let mut source = reader(stream, Some(3000), 0);
            let schema = source.schema.clone();
            let mut read = Vec::new();
            while let Some(b) = source.read(700).unwrap() {
                read.push(b);
            }
            let read = datafusion::arrow::compute::concat_batches(&schema, &read).unwrap();
            assert_eq!(written as usize, read.num_rows());
            assert_eq!(
                json.iter().filter(|b| **b == b'\n').count(),
                read.num_rows()
            );
            let decoded: Vec<_> = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
                .build(std::io::Cursor::new(json))
                .unwrap()
                .collect::<std::result::Result<_, _>>()
                .unwrap();
            let decoded = datafusion::arrow::compute::concat_batches(&schema, &decoded).unwrap();
            assert_eq!(decoded, read, "{stream}");
        }
    }

    #[test]
    fn people_and_auctions_come_in_their_proportions() {
        let count = |stream: &str| {
            let mut r = reader(stream, Some(5000), 0);
            let mut n = 0;
            while let Some(b) = r.read(4096).unwrap() {
                n += b.num_rows();
            }
            n
        };
        assert_eq!(count("person"), 100);
        assert_eq!(count("auction"), 300);
        assert!(columns("bids").is_err());
    }
}
