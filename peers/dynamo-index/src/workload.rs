//! Reads the workload file that `go run ./peers/kvindex gen` writes; its
//! layout is documented in peers/kvindex/format.go.

use std::fs;

pub const STORED: u8 = 1;
pub const REMOVED: u8 = 2;
pub const CASES: [&str; 3] = ["full", "early", "system"];

pub struct Event {
    pub kind: u8,
    pub worker: u32,
    pub parent: u64,
    pub hashes: Vec<u64>,
    pub contents: Vec<u32>,
}

pub struct Query {
    pub case: u8,
    pub contents: Vec<u32>,
}

pub struct Workload {
    pub block_size: u32,
    pub workers: u32,
    pub contents: Vec<Vec<u32>>,
    pub events: Vec<Event>,
    pub queries: Vec<Query>,
    pub final_entries: u64,
}

impl Workload {
    /// Token ids of blocks with the given contents.
    pub fn tokens(&self, contents: &[u32]) -> Vec<u32> {
        let mut out = Vec::with_capacity(contents.len() * self.block_size as usize);
        for &c in contents {
            out.extend_from_slice(&self.contents[c as usize]);
        }
        out
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.b.len() < n {
            return Err("truncated workload file".into());
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

pub fn read(path: &str) -> Result<Workload, String> {
    let data = fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let mut r = Reader { b: &data };
    if r.take(8)? != b"KVIPEER2" {
        return Err(format!("{path}: not a workload file of this version"));
    }
    let block_size = r.u32()?;
    let workers = r.u32()?;
    // Each worker's KV capacity in blocks: Dynamo's indexes take no
    // capacity, so it is read and not used.
    let _capacity = r.u32()?;
    let (n_contents, n_events, n_queries) = (r.u32()? as usize, r.u32()?, r.u32()?);
    let final_entries = r.u64()?;
    let mut contents = Vec::with_capacity(n_contents);
    for _ in 0..n_contents {
        let mut c = Vec::with_capacity(block_size as usize);
        for _ in 0..block_size {
            c.push(r.u32()?);
        }
        contents.push(c);
    }
    let mut events = Vec::with_capacity(n_events as usize);
    for i in 0..n_events {
        let kind = r.u8()?;
        let worker = r.u32()?;
        let n = r.u32()? as usize;
        if worker >= workers || n > r.b.len() {
            return Err(format!("{path}: event {i}: bad header"));
        }
        let mut ev = Event { kind, worker, parent: 0, hashes: Vec::with_capacity(n), contents: Vec::new() };
        match kind {
            STORED => {
                ev.parent = r.u64()?;
                ev.contents.reserve(n);
                for _ in 0..n {
                    ev.hashes.push(r.u64()?);
                    let c = r.u32()?;
                    if c as usize >= n_contents {
                        return Err(format!("{path}: event {i}: content out of range"));
                    }
                    ev.contents.push(c);
                }
            }
            REMOVED => {
                for _ in 0..n {
                    ev.hashes.push(r.u64()?);
                }
            }
            k => return Err(format!("{path}: event {i}: kind {k}")),
        }
        events.push(ev);
    }
    let mut queries = Vec::with_capacity(n_queries as usize);
    for i in 0..n_queries {
        let case = r.u8()?;
        let n = r.u32()? as usize;
        if case as usize >= CASES.len() || n > r.b.len() {
            return Err(format!("{path}: query {i}: bad header"));
        }
        let mut q = Query { case, contents: Vec::with_capacity(n) };
        for _ in 0..n {
            let c = r.u32()?;
            if c as usize >= n_contents {
                return Err(format!("{path}: query {i}: content out of range"));
            }
            q.contents.push(c);
        }
        queries.push(q);
    }
    if !r.b.is_empty() {
        return Err(format!("{path}: trailing bytes"));
    }
    Ok(Workload { block_size, workers, contents, events, queries, final_entries })
}
