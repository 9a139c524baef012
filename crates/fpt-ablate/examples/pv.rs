fn main() {
    let dir = std::path::Path::new("data/tables");
    for id in fpt_ablate::list(dir).unwrap() {
        let t = fpt_ablate::load_table(dir, &id).unwrap();
        for (text, v) in fpt_ablate::claims::on_paper(&t) {
            println!("{} | {} | {} | {}", t.id, v.verdict, text, v.detail);
        }
    }
}
