from pytest_spikecheck.data.corpus import burst_pool, phase19_corpus, phase19_eval_set
from pytest_spikecheck.data.tokenizer import train_bpe


def test_corpus_is_deterministic_and_sized():
    a, b = phase19_corpus(), phase19_corpus.__wrapped__()
    assert a == b
    assert len(a) == 240
    assert len({s.id for s in a}) == 240


def test_written_is_rare_in_the_corpus():
    corpus = phase19_corpus()
    written = [s for s in corpus if " written " in s.text]
    assert len(written) == 5
    assert all(s.rare for s in written) and sum(s.rare for s in corpus) == 5


def test_bpe_splits_written_and_tt_occurs_only_there():
    corpus = phase19_corpus()
    for vocab in (312, 384, 448):
        tok = train_bpe(tuple(s.text for s in corpus), vocab)
        assert tok.pieces(" written") == ["Ġwri", "tt", "en"], vocab
        tt = tok.token_id("tt")
        holders = [s for s in corpus if tt in tok.encode(s.text)]
        assert len(holders) == 5 and all(" written " in s.text for s in holders)


def test_eval_set_is_fixed_and_in_distribution():
    ev = phase19_eval_set()
    assert len(ev) == 96 and ev == phase19_eval_set.__wrapped__()
    assert not any(" written " in s.text for s in ev)
    assert {s.id for s in ev}.isdisjoint({s.id for s in phase19_corpus()})


def test_burst_pools_are_unseen_content():
    greek, caps = burst_pool("greek", 3), burst_pool("caps", 3)
    assert all(not any("a" <= ch <= "z" for ch in s.text) for s in greek)
    assert all(s.text == s.text.upper() for s in caps)
    assert all(s.source == "burst:greek" and s.rare for s in greek)


def test_tokenizer_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKECHECK_CACHE_DIR", str(tmp_path))
    texts = ("one short sentence.", "another short sentence.")
    tok = train_bpe.__wrapped__(texts, 270)
    files = list((tmp_path / "tokenizers").glob("*.json"))
    assert len(files) == 1
    again = train_bpe.__wrapped__(texts, 270)
    assert again.encode("short") == tok.encode("short")
