//! Barrier alignment over any number of input channels.
//!
//! When an input delivers the barrier of epoch e, it is not read again until every input has
//! delivered e: so the operator sees exactly the pre-barrier data of every input before the
//! barrier, and nothing after it. Nothing is buffered: a blocked input is simply not polled,
//! and its channel's bound pushes back on its upstream.

use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::mpsc;

use super::chunk::StreamChunk;
use super::message::{Barrier, Message, Watermark};

pub enum Event {
    /// A chunk from input `input`.
    Chunk { input: usize, chunk: StreamChunk },
    /// A watermark from input `input`.
    Watermark { input: usize, watermark: Watermark },
    /// Every input has delivered this barrier.
    Barrier(Barrier),
}

pub struct AlignedInputs {
    inputs: Vec<mpsc::Receiver<Message>>,
    /// The barrier each input delivered and is blocked on.
    blocked: Vec<Option<Barrier>>,
    /// Where the next poll starts, so that no input starves the others.
    next_poll: usize,
}

impl AlignedInputs {
    pub fn new(inputs: Vec<mpsc::Receiver<Message>>) -> AlignedInputs {
        let n = inputs.len();
        assert!(n > 0, "an actor has at least one input");
        AlignedInputs {
            inputs,
            blocked: vec![None; n],
            next_poll: 0,
        }
    }

    /// The next chunk, or the next barrier once every input delivered it. `None` once any
    /// input is closed: its upstream is gone, and so is this actor's reason to run.
    pub async fn next(&mut self) -> Option<Event> {
        poll_fn(|cx| {
            let n = self.inputs.len();
            for k in 0..n {
                let i = (self.next_poll + k) % n;
                if self.blocked[i].is_some() {
                    continue;
                }
                match self.inputs[i].poll_recv(cx) {
                    Poll::Ready(Some(Message::Chunk(chunk))) => {
                        self.next_poll = (i + 1) % n;
                        return Poll::Ready(Some(Event::Chunk { input: i, chunk }));
                    }
                    Poll::Ready(Some(Message::Watermark(watermark))) => {
                        self.next_poll = (i + 1) % n;
                        return Poll::Ready(Some(Event::Watermark {
                            input: i,
                            watermark,
                        }));
                    }
                    Poll::Ready(Some(Message::Barrier(b))) => {
                        if let Some(other) = self.blocked.iter().flatten().next() {
                            assert_eq!(
                                other.epoch, b.epoch,
                                "inputs delivered barriers of different epochs"
                            );
                        }
                        self.blocked[i] = Some(b);
                    }
                    Poll::Ready(None) => return Poll::Ready(None),
                    Poll::Pending => {}
                }
            }
            if self.blocked.iter().all(Option::is_some) {
                let mut barriers = self.blocked.iter_mut().map(|b| b.take());
                let first = barriers.next().flatten().expect("all inputs blocked");
                barriers.for_each(drop);
                return Poll::Ready(Some(Event::Barrier(first)));
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use crate::stream::message::BarrierKind;
    use datafusion::arrow::datatypes::DataType;
    use futures::FutureExt;

    fn barrier(epoch: u64) -> Message {
        Message::Barrier(Barrier {
            epoch,
            time_us: 0,
            kind: BarrierKind::Regular,
            mutation: None,
        })
    }

    fn data(v: i64) -> Message {
        let s = schema(&[("v", DataType::Int64)]);
        Message::Chunk(chunk(&s, &format!("+ {v}")))
    }

    /// Runs the aligner over inputs whose messages are all queued up front, returning the
    /// events as text: `3@1` is value 3 from input 1, `|2` is the barrier of epoch 2.
    async fn run(per_input: Vec<Vec<Message>>) -> Vec<String> {
        let mut receivers = vec![];
        for msgs in per_input {
            let (tx, rx) = mpsc::channel(16);
            for m in msgs {
                tx.send(m).await.unwrap();
            }
            receivers.push(rx);
            // Dropping tx closes the input once drained.
        }
        let mut aligned = AlignedInputs::new(receivers);
        let mut out = vec![];
        while let Some(ev) = aligned.next().await {
            out.push(match ev {
                Event::Chunk { input, chunk } => {
                    format!(
                        "{}@{input}",
                        chunk.to_string().trim().trim_start_matches("+ ")
                    )
                }
                Event::Watermark { input, watermark } => format!("w{}@{input}", watermark.value),
                Event::Barrier(b) => format!("|{}", b.epoch),
            });
        }
        out
    }

    /// Checks that every value appears between the barriers of its own epoch.
    fn assert_epochs(events: &[String], expected: &[(&str, u64)]) {
        for (value, epoch) in expected {
            let pos = events.iter().position(|e| e == value).unwrap();
            let barriers_before = events[..pos].iter().filter(|e| e.starts_with('|')).count();
            assert_eq!(barriers_before as u64, epoch - 1, "{value} in {events:?}");
        }
    }

    #[tokio::test]
    async fn barrier_on_one_input_while_the_other_still_sends_data() {
        let events = run(vec![
            vec![data(1), barrier(1), data(2)],
            vec![data(10), data(11), data(12), barrier(1), data(13)],
        ])
        .await;
        assert_eq!(events.iter().filter(|e| *e == "|1").count(), 1);
        assert_epochs(
            &events,
            &[
                ("1@0", 1),
                ("10@1", 1),
                ("11@1", 1),
                ("12@1", 1),
                ("2@0", 2),
                ("13@1", 2),
            ],
        );
    }

    #[tokio::test]
    async fn barriers_in_every_order_on_three_inputs() {
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            // Input k gets k+1 data messages before each barrier, in rounds that release the
            // inputs' barriers in `order`.
            let mut inputs: Vec<Vec<Message>> = vec![vec![], vec![], vec![]];
            for epoch in 1..=2u64 {
                for (rank, &k) in order.iter().enumerate() {
                    for j in 0..=rank {
                        inputs[k].push(data((epoch * 100 + k as u64 * 10 + j as u64) as i64));
                    }
                    inputs[k].push(barrier(epoch));
                }
            }
            let events = run(inputs).await;
            let barriers: Vec<_> = events.iter().filter(|e| e.starts_with('|')).collect();
            assert_eq!(barriers, ["|1", "|2"], "{order:?}");
            for e in &events {
                if let Some((v, _)) = e.split_once('@') {
                    let epoch = v.parse::<u64>().unwrap() / 100;
                    assert_epochs(&events, &[(e.as_str(), epoch)]);
                }
            }
        }
    }

    #[tokio::test]
    async fn a_slow_input_holds_the_barrier_back() {
        let (fast_tx, fast_rx) = mpsc::channel(4);
        let (slow_tx, slow_rx) = mpsc::channel(4);
        let mut aligned = AlignedInputs::new(vec![fast_rx, slow_rx]);
        fast_tx.send(data(1)).await.unwrap();
        fast_tx.send(barrier(1)).await.unwrap();
        fast_tx.send(data(2)).await.unwrap();
        assert!(matches!(
            aligned.next().await,
            Some(Event::Chunk { input: 0, .. })
        ));
        // The fast input is blocked on its barrier; nothing else is ready.
        assert!(
            aligned.next().now_or_never().is_none(),
            "data after a barrier must wait"
        );
        slow_tx.send(data(5)).await.unwrap();
        assert!(matches!(
            aligned.next().await,
            Some(Event::Chunk { input: 1, .. })
        ));
        slow_tx.send(barrier(1)).await.unwrap();
        assert!(matches!(aligned.next().await, Some(Event::Barrier(b)) if b.epoch == 1));
        assert!(matches!(
            aligned.next().await,
            Some(Event::Chunk { input: 0, .. })
        ));
    }
}
