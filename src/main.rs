fn main() {
    std::process::exit(redbfs::cli::main());
}
