// No console window on Windows release builds; harmless elsewhere.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

/// Every heap block is wiped when freed, as in the `postern` binary: the console runs the
/// broker in-process, so copies libraries make of a secret must not outlive the call.
#[global_allocator]
static ALLOCATOR: zeroizing_alloc::ZeroAlloc<std::alloc::System> =
    zeroizing_alloc::ZeroAlloc(std::alloc::System);

fn main() {
    std::process::exit(postern_desktop::main_entry());
}
