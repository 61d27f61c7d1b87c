//! Dynamo's published KV indexes (crate dynamo-kv-router, used as published)
//! on kvroute's index workload: the same file that kvroute's side reads
//! (peers/kvindex). Prints one JSON result per index, the fields of
//! peers/kvindex/measure.go's Result.
//!
//!   dynamo-index-bench --in FILE [--threads N] [--min-lookup-ms MS] [--index positional|radix|both] [--heap fresh|warm]
//!
//! Indexes measured in one process share its allocator: an index built
//! after another reuses the memory the first freed. kvroute's compare runs
//! each index in a process of its own (--index positional, --index radix);
//! --heap warm builds and drops the same index once before the clock.

mod workload;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::time::Instant;

use dynamo_kv_router::indexer::SyncIndexer;
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData,
    KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
    WorkerWithDpRank, compute_block_hash_for_seq, compute_next_seq_hash,
};
use dynamo_kv_router::indexer::positional::LevelIndex;
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, ThreadPoolIndexer};
use rustc_hash::FxHashMap;
use workload::{CASES, REMOVED, STORED, Workload};

/// Counts live heap bytes while COUNTING is set; the memory pass builds the
/// index again with it set, so the timed passes pay nothing for it.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// User + system CPU seconds of the whole process.
fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Args {
    input: String,
    threads: usize,
    min_lookup: f64,
    index: String,
    heap: String,
}

fn parse_args() -> Args {
    let mut a = Args { input: String::new(), threads: 1, min_lookup: 0.5, index: "both".into(), heap: "fresh".into() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().unwrap_or_else(|| die(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--in" => a.input = v,
            "--threads" => a.threads = v.parse().unwrap_or_else(|_| die("--threads")),
            "--min-lookup-ms" => a.min_lookup = v.parse::<f64>().unwrap_or_else(|_| die("--min-lookup-ms")) / 1e3,
            "--index" => a.index = v,
            "--heap" => a.heap = v,
            _ => die(&format!("unknown flag {flag}")),
        }
    }
    if a.input.is_empty() || a.threads == 0 || (a.heap != "fresh" && a.heap != "warm") {
        die("usage: dynamo-index-bench --in FILE [--threads N] [--min-lookup-ms MS] [--index positional|radix|both] [--heap fresh|warm]");
    }
    a
}

fn die(msg: &str) -> ! {
    eprintln!("dynamo-index-bench: {msg}");
    std::process::exit(2)
}

/// The workload's events as Dynamo's router receives them, and the CPU
/// seconds spent hashing: LocalBlockHash from each block's tokens
/// (compute_block_hash_for_seq) and ExternalSequenceBlockHash chained from
/// the parent's (compute_next_seq_hash), as a relay that recomputes the
/// rolling hash does; PositionalIndexer needs the crate's own chain hashes.
fn router_events(wl: &Workload) -> (Vec<RouterEvent>, f64) {
    let cpu0 = cpu_seconds();
    let mut seq: FxHashMap<u64, u64> = FxHashMap::default();
    let mut out = Vec::with_capacity(wl.events.len());
    for (i, e) in wl.events.iter().enumerate() {
        let data = if e.kind == STORED {
            let locals = compute_block_hash_for_seq(&wl.tokens(&e.contents), wl.block_size, BlockHashOptions::default());
            let parent = (e.parent != 0).then(|| seq[&e.parent]);
            let mut prev = parent;
            let mut blocks = Vec::with_capacity(locals.len());
            for (j, local) in locals.into_iter().enumerate() {
                let s = match prev {
                    None => local.0,
                    Some(p) => compute_next_seq_hash(p, local),
                };
                seq.insert(e.hashes[j], s);
                prev = Some(s);
                blocks.push(KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(s),
                    tokens_hash: local,
                    mm_extra_info: None,
                });
            }
            KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks,
            })
        } else {
            debug_assert_eq!(e.kind, REMOVED);
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: e.hashes.iter().map(|h| ExternalSequenceBlockHash(seq[h])).collect(),
            })
        };
        out.push(RouterEvent::new(e.worker as u64, KvCacheEvent { event_id: i as u64, data, dp_rank: 0 }));
    }
    (out, cpu_seconds() - cpu0)
}

struct Lookup {
    case: &'static str,
    lookups: usize,
    cpu: f64,
    wall: f64,
    checksum: u64,
}

/// Looks up every prompt of a case (find_matches, no early exit) in passes
/// on `threads` threads until `min_wall` has passed.
fn lookup(find: &(dyn Fn(&[LocalBlockHash]) -> u64 + Sync), case: &'static str, prompts: &[Vec<LocalBlockHash>], threads: usize, min_wall: f64) -> Lookup {
    let checksum = prompts.iter().map(|p| find(p)).sum();
    let mut passes = 1;
    loop {
        let (cpu0, wall0) = (cpu_seconds(), Instant::now());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut sink = 0u64;
                    for _ in 0..passes {
                        for p in prompts {
                            sink = sink.wrapping_add(find(p));
                        }
                    }
                    std::hint::black_box(sink);
                });
            }
        });
        let wall = wall0.elapsed().as_secs_f64();
        if wall >= min_wall {
            return Lookup { case, lookups: passes * prompts.len() * threads, cpu: cpu_seconds() - cpu0, wall, checksum };
        }
        passes *= 2;
    }
}

/// Splits events into per-thread lanes by worker, as ThreadPoolIndexer's
/// sticky routing does: each worker's events stay in order on one thread.
fn lanes(events: Vec<RouterEvent>, threads: usize) -> Vec<Vec<RouterEvent>> {
    let mut out: Vec<Vec<RouterEvent>> = (0..threads).map(|_| Vec::new()).collect();
    for ev in events {
        out[(ev.worker_id % threads as u64) as usize].push(ev);
    }
    out
}

/// PositionalIndexer (jump size 32): apply_event called directly on
/// `threads` threads, each owning its workers' reverse maps, so no channel
/// sits between the events and the index.
fn apply_positional(ix: &PositionalIndexer, events: Vec<RouterEvent>, threads: usize) -> Vec<FxHashMap<WorkerWithDpRank, LevelIndex>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = lanes(events, threads)
            .into_iter()
            .map(|lane| {
                s.spawn(move || {
                    let mut worker_blocks = FxHashMap::default();
                    for ev in lane {
                        if let Err(e) = ix.apply_event(&mut worker_blocks, ev, None) {
                            die(&format!("PositionalIndexer: {e:?}"));
                        }
                    }
                    worker_blocks
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// ConcurrentRadixTreeCompressed behind ThreadPoolIndexer with `threads`
/// event threads, its published write path (apply_event is private).
fn apply_radix(rt: &tokio::runtime::Runtime, events: Vec<RouterEvent>, threads: usize, block_size: u32) -> ThreadPoolIndexer<ConcurrentRadixTreeCompressed> {
    let _enter = rt.enter();
    let pool = ThreadPoolIndexer::new(ConcurrentRadixTreeCompressed::new(), threads, block_size);
    for ev in events {
        pool.enqueue_event(ev).unwrap_or_else(|e| die(&format!("ThreadPoolIndexer: {e:?}")));
    }
    rt.block_on(pool.flush_and_wait()).unwrap_or_else(|e| die(&format!("ThreadPoolIndexer flush: {e:?}")));
    pool
}

fn score_sum(s: &dynamo_kv_router::OverlapScores) -> u64 {
    s.scores.values().map(|&v| v as u64).sum()
}

fn main() {
    let args = parse_args();
    let wl = workload::read(&args.input).unwrap_or_else(|e| die(&e));
    let mut prompts: Vec<Vec<Vec<LocalBlockHash>>> = vec![Vec::new(); CASES.len()];
    for q in &wl.queries {
        prompts[q.case as usize].push(compute_block_hash_for_seq(&wl.tokens(&q.contents), wl.block_size, BlockHashOptions::default()));
    }
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let stored_blocks: usize = wl.events.iter().filter(|e| e.kind == STORED).map(|e| e.hashes.len()).sum();
    let (events, _) = router_events(&wl);
    let indexes: Vec<&str> = match args.index.as_str() {
        "both" => vec!["positional", "radix"],
        "positional" => vec!["positional"],
        "radix" => vec!["radix"],
        other => die(&format!("--index {other}")),
    };
    for name in indexes {
        if args.heap == "warm" {
            // The same index built once and dropped before the clock, so
            // that the timed build reuses the memory the allocator has
            // already taken from the kernel, as a router past its first
            // minutes does.
            let (evs, _) = router_events(&wl);
            if name == "positional" {
                let ix = PositionalIndexer::new(32);
                drop(apply_positional(&ix, evs, args.threads));
            } else {
                let pool = apply_radix(&rt, evs, args.threads, wl.block_size);
                let _enter = rt.enter();
                drop(pool);
            }
        }
        // Hashing is timed apart: a fresh conversion per index.
        let (evs, hash_cpu) = router_events(&wl);
        let (cpu0, wall0) = (cpu_seconds(), Instant::now());
        let (apply_cpu, apply_wall, results, label);
        if name == "positional" {
            let ix = PositionalIndexer::new(32);
            let maps = apply_positional(&ix, evs, args.threads);
            apply_wall = wall0.elapsed().as_secs_f64();
            apply_cpu = cpu_seconds() - cpu0;
            let find = |p: &[LocalBlockHash]| score_sum(&ix.find_matches(p, false));
            results = (0..CASES.len()).map(|c| lookup(&find, CASES[c], &prompts[c], args.threads, args.min_lookup)).collect::<Vec<_>>();
            drop(maps);
            label = "PositionalIndexer(jump 32)";
        } else {
            let pool = apply_radix(&rt, evs, args.threads, wl.block_size);
            apply_wall = wall0.elapsed().as_secs_f64();
            apply_cpu = cpu_seconds() - cpu0;
            let backend = pool.backend();
            let find = |p: &[LocalBlockHash]| score_sum(&backend.find_matches(p, false));
            results = (0..CASES.len()).map(|c| lookup(&find, CASES[c], &prompts[c], args.threads, args.min_lookup)).collect::<Vec<_>>();
            let _enter = rt.enter();
            drop(pool);
            label = "ThreadPoolIndexer<ConcurrentRadixTreeCompressed>";
        }
        let bytes = memory_pass(name, &rt, &events, &wl);
        let lookups: Vec<String> = results
            .iter()
            .map(|l| format!(r#"{{"case":"{}","lookups":{},"cpu_s":{},"wall_s":{},"checksum":{}}}"#, l.case, l.lookups, l.cpu, l.wall, l.checksum))
            .collect();
        println!(
            r#"{{"side":"dynamo","index":"{label}","heap":"{}","workers":{},"threads":{},"events":{},"blocks":{},"apply_cpu_s":{},"apply_wall_s":{},"hash_cpu_s":{},"entries":{},"bytes_per_entry":{},"bytes_how":"live heap bytes counted by a global allocator wrapper, after minus before applying (one thread)","lookups":[{}]}}"#,
            args.heap,
            wl.workers,
            args.threads,
            wl.events.len(),
            stored_blocks,
            apply_cpu,
            apply_wall,
            hash_cpu,
            wl.final_entries,
            bytes as f64 / wl.final_entries as f64,
            lookups.join(",")
        );
    }
}

/// Builds the index again on one thread with the allocator counting and
/// returns the live bytes it holds once every event is applied and freed.
fn memory_pass(name: &str, rt: &tokio::runtime::Runtime, events: &[RouterEvent], wl: &Workload) -> isize {
    let evs: Vec<RouterEvent> = events.to_vec();
    LIVE.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    // Events are counted as they are freed: start the count below zero by
    // what they hold, so that the balance is what the index keeps.
    let held = -event_bytes(&evs);
    let live;
    if name == "positional" {
        let ix = PositionalIndexer::new(32);
        let maps = apply_positional(&ix, evs, 1);
        live = LIVE.load(Ordering::SeqCst);
        COUNTING.store(false, Ordering::SeqCst);
        drop(maps);
    } else {
        let pool = apply_radix(rt, evs, 1, wl.block_size);
        live = LIVE.load(Ordering::SeqCst);
        COUNTING.store(false, Ordering::SeqCst);
        let _enter = rt.enter();
        drop(pool);
    }
    live - held
}

/// Heap bytes the events own (their block and hash vectors, and the
/// vector holding them), freed as the index consumes them.
fn event_bytes(evs: &[RouterEvent]) -> isize {
    let mut n = std::mem::size_of_val(evs);
    for ev in evs {
        n += match &ev.event.data {
            KvCacheEventData::Stored(s) => s.blocks.capacity() * std::mem::size_of::<KvCacheStoredBlockData>(),
            KvCacheEventData::Removed(r) => r.block_hashes.capacity() * std::mem::size_of::<ExternalSequenceBlockHash>(),
            KvCacheEventData::Cleared => 0,
        };
    }
    n as isize
}
