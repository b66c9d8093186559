//! The `moongate` binary: [`moongate::run`], with the process's allocator.

fn main() -> anyhow::Result<()> {
    moongate::run()
}

/// mimalloc, without transparent huge pages (the workspace's `no_thp` feature): the
/// tokenizer behind `kv_aware` allocates a few small buffers per word it pre-tokenizes, and
/// glibc's allocator spent half of a new prompt's encoding in `malloc` and `free`. With
/// mimalloc a gateway tokenizing every prompt spends 25-40% less CPU a request; with huge
/// pages its resident memory grew by 10-80 MiB, without them it is glibc's within a few MiB.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
