"""``relmem train squad --task.document article``: each question's row reads paragraphs of its
article joined in article order (for training its own and ranked distractors, for evaluation
the best ranked), and answers map back to the right paragraph's text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reading_sample import train_args

from relmem import cli
from relmem.models.reader import Reader
from relmem.tasks.base import Batch
from relmem.tasks.reading.answer import AnswerReader
from relmem.tasks.reading.articles import rank_in_articles
from relmem.tasks.reading.ranking import RANKERS, ParagraphIndex, Ranker
from relmem.tasks.reading.task import HELD_OUT, TRAIN, Reading, ReadingConfig, best_spans

# three articles of 4, 3 and 3 paragraphs; each question (paragraph, question, answer) is about
# words of its own paragraph, but the last "Harbours" one, whose words are those of another
ARTICLES = {
    "Harbours": [
        "The Arbroath harbour was built of red sandstone in 1394. Fishing boats still land "
        "haddock there.",
        "A lighthouse keeper named Robert Stevenson designed the Bell Rock light in 1810.",
        "The harbour master collects fees from yachts and trawlers every summer.",
        "Smokehouses near the harbour cure the famous Arbroath smokie over beech chips.",
    ],
    "Bees": [
        "Honey bees dance to tell their sisters where nectar lies. Karl von Frisch decoded "
        "the waggle dance.",
        "A queen bee lays up to two thousand eggs a day during spring.",
        "Beeswax is secreted by glands under the abdomen of young workers.",
    ],
    "Clocks": [
        "A chess clock has two displays, one for each player.",
        "Digital clocks can add a delay or an increment after every move.",
        "The first tournament to use clocks was held in London in 1883.",
    ],
}
QUESTIONS = {
    "Harbours": [
        (0, "When was the Arbroath harbour built?", "1394"),
        (1, "Who designed the Bell Rock light?", "Robert Stevenson"),
        (3, "What do smokehouses cure over beech chips?", "the famous Arbroath smokie"),
        (2, "Who takes money in the Arbroath harbour built of red sandstone?", "harbour master"),
    ],
    "Bees": [
        (0, "Who decoded the waggle dance?", "Karl von Frisch"),
        (1, "How many eggs does a queen bee lay a day?", "two thousand"),
        (2, "What secretes beeswax?", "glands"),
    ],
    "Clocks": [
        (0, "How many displays does a chess clock have?", "two"),
        (1, "What can digital clocks add after every move?", "a delay or an increment"),
        (2, "Where was the first tournament to use clocks held?", "London"),
    ],
}
MISSED = "h3"  # the question whose own paragraph BM25+ ranks below another's


def squad_document(articles=ARTICLES, questions=QUESTIONS, titled: bool = True) -> dict:
    """The articles in SQuAD's layout, question ids ``h0``, ``b1``... counted by the title's
    first letter."""
    data, counts = [], dict[str, int]()
    for title, paragraphs in articles.items():
        records = [{"context": text, "qas": []} for text in paragraphs]
        for p, question, answer in questions.get(title, []):
            start = paragraphs[p].index(answer)
            letter = title[0].lower()
            counts[letter] = counts.get(letter, -1) + 1
            records[p]["qas"].append({
                "id": f"{letter}{counts[letter]}", "question": question,
                "answers": [{"text": answer, "answer_start": start}],
            })  # fmt: skip
        data.append({"title": title if titled else None, "paragraphs": records})
    return {"version": "1.1", "data": data}


def write(path: Path, document: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def articles_file(tmp_path: Path) -> Path:
    return write(tmp_path / "data" / "articles.json", squad_document())


def build(path: Path, **options) -> Reading:
    """The task on ``path`` as both training and evaluation file, reading articles."""
    config = {"document": "article", "top_k": 2, "max_context_tokens": None, **options}
    return Reading(ReadingConfig(train_file=path, dev_file=path, min_char_count=1, **config))


def question_index(task: Reading, qid: str) -> int:
    return next(i for i, q in enumerate(task.train.squad.questions) if q.qid == qid)


@pytest.mark.parametrize("training_ranker", RANKERS)
def test_training_rows_hold_their_own_paragraph_and_ranked_distractors_in_article_order(
    articles_file: Path, training_ranker: Ranker
) -> None:
    task = build(articles_file, top_k=3, training_ranker=training_ranker)
    squad, encoded = task.train.squad, task.train
    ranked = rank_in_articles(squad, range(len(squad.questions)), training_ranker)
    index = task.train_index
    batch = task._batch(TRAIN, index, None)
    q = task.config.question_tokens
    for row, i in enumerate(index.tolist()):
        question, read = squad.questions[i], task.contexts[TRAIN][i]
        members = squad.article_paragraphs()[squad.titles[question.paragraph]]
        others = [p for p in ranked[i].paragraphs if p != question.paragraph][:2]
        assert read == sorted([question.paragraph, *others]) and set(read) <= set(members)
        first, last = batch.targets[row, :2].tolist()
        assert encoded.answer_text(i, first, last, read)[0] == question.answers[0]
        # the row's tokens at the gold span are the own paragraph's tokens at its own gold
        own = int(encoded.starts[question.paragraph]) + encoded.gold[i]
        expected = encoded.words[own[0] : own[1] + 1]
        assert torch.equal(batch.inputs[row, q + first : q + last + 1, 0], expected)
        assert int(batch.lengths[row]) == q + sum(encoded.sizes[p] for p in read)
    # the smokehouse question: its own paragraph (the article's last) read after two others,
    # its gold span offset by their tokens
    smoke = question_index(task, "h2")
    row = index.tolist().index(smoke)
    assert task.contexts[TRAIN][smoke] == [0, 1, 3] and squad.questions[smoke].paragraph == 3
    offset = encoded.sizes[0] + encoded.sizes[1]
    assert batch.targets[row, :2].tolist() == (encoded.gold[smoke] + offset).tolist()


def test_held_out_rows_read_the_top_k_whether_or_not_their_own_is_among_them(
    articles_file: Path,
) -> None:
    task = build(articles_file, top_k=1)
    assert (task.config.ranker, task.config.training_ranker) == ("bm25-proximity", "bm25")
    squad = task.held.squad
    missed = question_index(task, MISSED)
    ranked = rank_in_articles(squad, [missed], task.config.ranker)[missed].paragraphs
    assert ranked[0] == 0 and squad.questions[missed].paragraph == 2  # the ranker misses it
    assert task.contexts[HELD_OUT][missed] == [0]
    assert task.contexts[TRAIN][missed] == [2]  # training reads its own (top_k 1: no other)
    held = task.held_out(torch.device("cpu"))
    row = held.targets[:, 2].tolist().index(missed)
    assert held.targets[row, :2].tolist() == [-1, -1]
    batch = held.select(torch.tensor([row]))
    # predict "harbour" of the paragraph read: scored against the reference text, not the
    # gold span ("harbour" against "harbour master": F1 2/3); no loss without a gold span
    tokens = [squad.contexts[0][s:e] for s, e in task.held.spans[: task.held.sizes[0]].tolist()]
    at = tokens.index("harbour")
    logits = torch.full((1, batch.inputs.shape[1] - task.config.question_tokens + 1, 2), -9.0)
    logits[0, 1 + at] = 9.0
    measures = task.measure(logits, batch)
    assert measures["f1"].total.item() == pytest.approx(2 / 3)
    assert measures["loss"].total.item() == 0.0
    assert task.predictions(logits, batch) == {MISSED: "harbour"}
    # every other question's own paragraph ranks first: read, its gold offset into the row
    for i in task.held_index.tolist():
        if i != missed:
            assert task.contexts[HELD_OUT][i] == [squad.questions[i].paragraph]


def test_top_k_0_reads_every_paragraph_of_the_article(articles_file: Path) -> None:
    task = build(articles_file, top_k=0, length_buckets=(30,))
    squad = task.train.squad
    for i, question in enumerate(squad.questions):
        members = squad.article_paragraphs()[squad.titles[question.paragraph]]
        assert task.contexts[HELD_OUT][i] == members == task.contexts[TRAIN][i]
    held = task.held_out(torch.device("cpu"))
    joined = {title: sum(task.held.sizes[p] for p in members)
              for title, members in squad.article_paragraphs().items()}  # fmt: skip
    expected = [joined[squad.titles[squad.questions[i].paragraph]] for i in held.targets[:, 2]]
    assert (held.lengths - task.config.question_tokens).tolist() == expected
    # the length groups count the joined context: every article is over 30 tokens, and no
    # paragraph
    assert max(task.held.sizes) < 30 < min(expected) and (held.groups == 1).all()


def test_an_article_run_also_reads_each_held_out_question_from_its_own_paragraph(
    articles_file: Path,
) -> None:
    task = build(articles_file, top_k=0)
    paragraph = Reading(ReadingConfig(
        train_file=articles_file, dev_file=articles_file, min_char_count=1,
        max_context_tokens=None,
    ))  # fmt: skip
    cpu = torch.device("cpu")
    assert paragraph.more_held_out(cpu) == {}
    own = task.more_held_out(cpu)["paragraph-level"]
    expected = paragraph.held_out(cpu)
    rows = torch.arange(own.size)
    mine, theirs = own.select(rows), expected.select(rows)
    # the same rows as the paragraph run's held-out set, in the same order, where the
    # article run's own held-out rows read whole articles
    assert torch.equal(mine.inputs, theirs.inputs) and torch.equal(mine.lengths, theirs.lengths)
    assert torch.equal(mine.targets[:, :3], theirs.targets[:, :3])
    assert torch.equal(mine.groups, theirs.groups)
    assert (task.held_out(cpu).lengths > own.lengths.max()).any()
    # a span is cut from the question's own paragraph: the gold span gives the answer
    logits = torch.full((own.size, mine.inputs.shape[1] - task.config.question_tokens + 1, 2), -9.0)
    for row in range(own.size):
        first, last = mine.targets[row, :2].tolist()
        logits[row, 1 + first, 0] = logits[row, 1 + last, 1] = 9.0
    answers = task.predictions(logits, mine)
    questions = {q.qid: q for q in task.held.squad.questions}
    assert answers == {qid: questions[qid].answers[0] for qid in answers}
    assert task.measure(logits, mine)["f1"].value().item() == pytest.approx(1.0)


def test_a_predicted_span_maps_to_its_own_paragraphs_text(articles_file: Path) -> None:
    task = build(articles_file, top_k=0)
    encoded = task.train
    first = question_index(task, "b0")
    read = task.contexts[TRAIN][first]  # the Bees article's 3 paragraphs
    sizes = [encoded.sizes[p] for p in read]
    # the first token of the second paragraph, and the last two of the third
    text, start, end = encoded.answer_text(first, sizes[0], sizes[0], read)
    assert (text, start) == ("A", 0) and encoded.squad.contexts[read[1]][start:end] == text
    at = sizes[0] + sizes[1] + sizes[2] - 3
    assert encoded.answer_text(first, at, at + 1, read)[0] == "young workers"
    with pytest.raises(ValueError, match="run past the end of paragraph"):
        encoded.answer_text(first, sizes[0] - 1, sizes[0], read)
    # the span search never proposes a span across a paragraph boundary
    logits = torch.full((1, 1 + sum(sizes), 2), -5.0)
    logits[0, 0] = float("-inf")
    logits[0, sizes[0], 0] = 10.0  # start: the first paragraph's last token
    logits[0, 1 + sizes[0], 1] = 10.0  # end: the second paragraph's first token
    crossing = best_spans(logits, 5)
    assert (crossing[0].item(), crossing[1].item()) == (sizes[0] - 1, sizes[0])
    segments = encoded.segments(read).unsqueeze(0)
    span_first, span_last, _ = best_spans(logits, 5, segments)
    assert span_first.item() == span_last.item() and span_first.item() in (sizes[0] - 1, sizes[0])
    # nor one into padding (segment -1), however it scores
    padded = torch.cat([logits, torch.full((1, 2, 2), 50.0)], dim=1)
    segments = torch.cat([segments, torch.tensor([[-1, -1]])], dim=1)
    assert best_spans(padded, 5, segments)[0].item() == span_first.item()
    batch = Batch(torch.zeros(1, 1), torch.tensor([[-1, -1, first, TRAIN]]))
    assert task.predicted_texts(logits, batch)[0] in (".", "A")


def test_windows_rows_stand_their_paragraphs_one_padding_step_apart(articles_file: Path) -> None:
    joined, windows = (
        build(articles_file, top_k=3),
        build(articles_file, top_k=3, reading="windows"),
    )
    assert windows.spec.options["reader"].windows and not joined.spec.options["reader"].windows
    assert windows.contexts == joined.contexts  # the same paragraphs, read another way
    index = windows.train_index
    mine, theirs = windows._batch(TRAIN, index, None), joined._batch(TRAIN, index, None)
    q = windows.config.question_tokens
    for row, i in enumerate(index.tolist()):
        read = windows.contexts[TRAIN][i]
        sizes = [windows.train.sizes[p] for p in read]
        gaps = torch.tensor([sum(sizes[: k + 1]) + k for k in range(len(read) - 1)])
        assert int(mine.lengths[row]) == q + sum(sizes) + len(read) - 1
        assert (mine.inputs[row, q + gaps] == 0).all()  # a padding step between paragraphs
        steps = torch.arange(int(mine.lengths[row]) - q)
        tokens = steps[~torch.isin(steps, gaps)]
        assert torch.equal(
            mine.inputs[row, q + tokens, 0], theirs.inputs[row, q : q + len(tokens), 0]
        )
        # the gold span: the joined row's, moved past the gaps before its paragraph
        first, last = mine.targets[row, :2].tolist()
        before = read.index(windows.train.squad.questions[i].paragraph)
        assert [first, last] == [v + before for v in theirs.targets[row, :2].tolist()]
        answer = windows.train.answer_text(i, first, last, read, gap=1)[0]
        assert answer == windows.train.squad.questions[i].answers[0]
        segments = windows.train.segments(read, gap=1)
        assert (segments[gaps] == -1).all() and (segments[tokens] >= 0).all()
    with pytest.raises(ValueError, match="lies on the gap before paragraph"):
        i = index[0].item()
        read = windows.contexts[TRAIN][i]
        windows.train.answer_text(i, windows.train.sizes[read[0]], 0, read, gap=1)
    # a predicted span maps to its paragraph's text: the smokehouse question's own paragraph
    # is its row's third, after two others and two gaps
    smoke = question_index(windows, "h2")
    read = windows.contexts[TRAIN][smoke]
    at = windows.train.sizes[read[0]] + windows.train.sizes[read[1]] + 2
    batch = Batch(torch.zeros(1, 1), torch.tensor([[-1, -1, smoke, TRAIN]]))
    logits = torch.full((1, 1 + int(windows.context_tokens[TRAIN][smoke]), 2), -9.0)
    logits[0, 1 + at, 0] = logits[0, 1 + at, 1] = 9.0
    assert windows.predicted_texts(logits, batch) == ["Smokehouses"]
    assert (
        windows.data_identity()["reading"] == "windows" and "reading" not in joined.data_identity()
    )


@pytest.mark.parametrize("reading", ["joined", "windows"])
def test_rank_prior_rows_carry_each_paragraphs_rank_among_the_rows(
    articles_file: Path, reading: str
) -> None:
    plain = build(articles_file, top_k=3, reading=reading)
    task = build(articles_file, top_k=3, reading=reading, rank_prior=True)
    assert task.spec.options["reader"].paragraph_ranks == 3
    assert plain.spec.options["reader"].paragraph_ranks == 0
    assert task.data_identity()["rank_prior"] and "rank_prior" not in plain.data_identity()
    squad, q, gap = task.train.squad, task.config.question_tokens, task.gap
    rankers = {TRAIN: task.config.training_ranker, HELD_OUT: task.config.ranker}
    for split in (TRAIN, HELD_OUT):
        ranked = rank_in_articles(squad, range(len(squad.questions)), rankers[split])
        index = task.train_index if split == TRAIN else task.held_index
        mine, theirs = task._batch(split, index, None), plain._batch(split, index, None)
        width = 3 + task.config.chars
        assert mine.inputs.shape[2] == width + 1 and theirs.inputs.shape[2] == width
        assert torch.equal(mine.inputs[..., :width], theirs.inputs)  # the rest as before
        assert not mine.inputs[:, :q, width].any()  # the question has no rank
        for row, i in enumerate(index.tolist()):
            read = task.contexts[split][i]
            order = sorted(read, key=ranked[i].paragraphs.index)  # the row's paragraphs, best first
            assert task.ranks[split][i] == [order.index(p) + 1 for p in read]
            expected = []
            for k, p in enumerate(read):
                expected += [0] * (gap if k else 0) + [order.index(p) + 1] * task.train.sizes[p]
            steps = int(mine.lengths[row]) - q
            assert mine.inputs[row, q : q + steps, width].tolist() == expected
            assert not mine.inputs[row, q + steps :, width].any()
    # the smokehouse question's training row: paragraphs 0, 1 and its own 3, ranked 3, 0, 1
    smoke = question_index(task, "h2")
    assert task.contexts[TRAIN][smoke] == [0, 1, 3] and task.ranks[TRAIN][smoke] == [2, 3, 1]
    # read from its own paragraph alone, a question's paragraph ranks first
    own = task.more_held_out(torch.device("cpu"))["paragraph-level"]
    batch = own.select(torch.arange(own.targets.shape[0]))
    context = batch.inputs[:, q:, -1]
    assert set(context[batch.inputs[:, q:, 0] != 0].tolist()) == {1}


@pytest.mark.parametrize("favoured", [1, 2, 3])
def test_a_rank_prior_reader_answers_with_each_paragraphs_rank(
    articles_file: Path, favoured: int
) -> None:
    task = build(articles_file, top_k=3, rank_prior=True)
    model = Reader(task.spec.options["reader"], [])
    with torch.no_grad():  # the prior outweighs anything the untrained reader says
        model.rank_prior.weight[favoured] = 1e2
    reader = AnswerReader(task.vocabulary, task.config, model)
    context = "\n\n".join(ARTICLES["Harbours"])
    question = "Who designed the Bell Rock light?"
    found = reader(context, question, paragraphs=3)
    order = ParagraphIndex(ARTICLES["Harbours"]).top(question, 3)
    assert found.paragraph == order[favoured - 1]
    assert found.text in ARTICLES["Harbours"][found.paragraph]


def test_a_training_row_leaves_out_distractors_past_max_context_tokens(
    articles_file: Path,
) -> None:
    task = build(articles_file, top_k=4, max_context_tokens=40)
    encoded, squad = task.train, task.train.squad
    shortened = 0
    for i in task.train_index.tolist():
        read = task.contexts[TRAIN][i]
        own = squad.questions[i].paragraph
        tokens = sum(encoded.sizes[p] for p in read)
        assert own in read and tokens <= 40
        members = squad.article_paragraphs()[squad.titles[own]]
        for p in set(members) - set(read):  # left out only where it would not fit
            assert tokens + encoded.sizes[p] > 40
        shortened += len(read) < len(members)
    assert shortened >= 4
    batch = task.sample(4, torch.Generator().manual_seed(0))
    assert (batch.targets[:, 0] >= 0).all()  # every gold kept
    assert len(task.contexts[HELD_OUT][0]) == 4  # evaluation rows are never cut


def test_repeated_paragraphs_are_read_once_the_questions_own_in_place_of_its_twin(
    tmp_path: Path,
) -> None:
    twin = ARTICLES["Clocks"][0]
    articles = {**ARTICLES, "Clocks": [*ARTICLES["Clocks"], twin]}
    questions = {**QUESTIONS, "Clocks": [*QUESTIONS["Clocks"], (3, "How many displays?", "two")]}
    path = write(tmp_path / "twins.json", squad_document(articles, questions))
    task = build(path, top_k=0)
    squad = task.train.squad
    first, second = question_index(task, "c0"), question_index(task, "c3")
    members = squad.article_paragraphs()["Clocks"]
    assert len(members) == 4
    assert task.contexts[TRAIN][first] == members[:3]  # the twin left out
    assert task.contexts[TRAIN][second] == members[1:]  # its own in the first copy's place
    assert task.contexts[HELD_OUT][second] == members[1:]
    batch = task._batch(HELD_OUT, torch.tensor([second]), None)
    first_token, last = batch.targets[0, :2].tolist()
    assert task.held.answer_text(second, first_token, last, members[1:])[0] == "two"


def test_paragraph_runs_keep_their_data_identity(articles_file: Path) -> None:
    config = ReadingConfig(train_file=articles_file, dev_file=articles_file, min_char_count=1)
    paragraph = Reading(config)
    assert set(paragraph.data_identity()) == {"vocabulary"}
    assert paragraph.contexts[TRAIN] == [[q.paragraph] for q in paragraph.train.squad.questions]
    article = build(articles_file, top_k=3)
    assert article.data_identity() == {
        "vocabulary": paragraph.data_identity()["vocabulary"],
        "document": "article",
        "top_k": 3,
    }


def test_train_and_eval_reading_articles(articles_file: Path, tmp_path: Path, capsys) -> None:
    folder = articles_file.parent
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (folder / name).write_bytes(articles_file.read_bytes())
    article = ["--task.document", "article", "--task.top-k", "2"]
    assert cli.main(train_args(folder, tmp_path, "article", *article)) == 0
    assert (
        "articles (joined; held-out rows bm25-proximity ranked, training rows bm25): the 2 "
        "best paragraphs a row" in capsys.readouterr().err
    )
    run = tmp_path / "article"
    config = json.loads((run / "config.json").read_text())["task"]
    assert (config["document"], config["top_k"]) == ("article", 2)
    data = json.loads((run / "data.json").read_text())
    assert (data["document"], data["top_k"]) == ("article", 2)
    assert cli.main(["eval", str(run)]) == 0
    record = json.loads((run / "eval.json").read_text())
    assert record["official"]["all"]["total"] == 10
    # the trainer's held-out F1 is that of the official script on the same predictions
    assert record["official"]["all"]["f1"] == pytest.approx(100 * record["f1"])
    predictions = json.loads((run / "eval-predictions-held-out.json").read_text())
    contexts = {q: " ".join(ARTICLES[t]) for t, qs in QUESTIONS.items()
                for q in (f"{t[0].lower()}{k}" for k in range(len(qs)))}  # fmt: skip
    assert set(predictions) == set(contexts)
    assert all(text in contexts[q] for q, text in predictions.items())
    out = tmp_path / "article-eval.json"
    argv = ["eval", str(run), "--document", "article", "--json-out", str(out)]
    assert cli.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["article"]["official"]["all"]["total"] == 10
    # and from each question's own paragraph: the same run's paragraph-level figures
    assert record["more_held_out"]["paragraph-level"]["count"] == 10
    assert "paragraph-level F1 " in capsys.readouterr().out
    # a paragraph run refuses the article run's weights: they were trained on other rows
    assert cli.main(train_args(folder, tmp_path, "paragraph", "--steps", "1")) == 0
    capsys.readouterr()
    best = run / "checkpoints" / "best"
    other = tmp_path / "other.json"
    paragraph_run = str(tmp_path / "paragraph")
    argv = ["eval", paragraph_run, "--checkpoint", str(best), "--json-out", str(other)]
    assert cli.main(argv) == 2
    assert "its document, top_k differ from the run's" in capsys.readouterr().err
    assert not other.exists()
    # the same data read as windows: trained, evaluated, and the joined run's weights refused
    windows = ["--task.reading", "windows"]
    assert cli.main(train_args(folder, tmp_path, "windows", *article, *windows)) == 0
    run = tmp_path / "windows"
    assert json.loads((run / "config.json").read_text())["task"]["reading"] == "windows"
    assert json.loads((run / "data.json").read_text())["reading"] == "windows"
    assert cli.main(["eval", str(run), "--document", "article"]) == 0
    record = json.loads((run / "eval.json").read_text())
    assert record["official"]["all"]["total"] == 10 and "article" in record
    capsys.readouterr()
    argv = ["eval", str(run), "--checkpoint", str(best), "--json-out", str(other)]
    assert cli.main(argv) == 2
    assert "differ from the run's" in capsys.readouterr().err
    # with a rank prior: trained, evaluated from the rows and the whole articles
    assert cli.main(train_args(folder, tmp_path, "ranked", *article, "--task.rank-prior")) == 0
    run = tmp_path / "ranked"
    assert json.loads((run / "data.json").read_text())["rank_prior"] is True
    assert cli.main(["eval", str(run), "--document", "article"]) == 0
    record = json.loads((run / "eval.json").read_text())
    assert record["official"]["all"]["total"] == 10
    assert record["article"]["official"]["all"]["total"] == 10


def one_paragraph_articles(titled: bool) -> dict:
    """Each paragraph an article: distinct titles, or none (each untitled article its own)."""
    articles = {f"{t} {k}": [text] for t, texts in ARTICLES.items() for k, text in enumerate(texts)}
    questions = {f"{t} {p}": [(0, q, a)] for t, qs in QUESTIONS.items() for p, q, a in qs}
    return squad_document(articles, questions, titled)


@pytest.mark.parametrize(
    ("options", "document", "message"),
    [
        (["--task.top-k", "-1"], None, "task.top_k must be >= 0, got -1"),
        (["--task.top-k", "5"], None,
         "task.top_k must be <= 4, the paragraphs of the largest article of {file}, got 5"),
        ([], one_paragraph_articles(True),
         "--task.document article: nothing to rank: every article of {file} has one paragraph"),
        ([], one_paragraph_articles(False),
         "--task.document article: nothing to rank: every article of {file} has one paragraph"),
        (["--task.document", "paragraph", "--task.reading", "windows"], None,
         "task.reading windows reads each of a row's paragraphs on its own: it needs "
         "--task.document article"),
        (["--task.document", "paragraph", "--task.rank-prior"], None,
         "task.rank_prior weighs the rank of each of a row's paragraphs: it needs "
         "--task.document article"),
    ],
)  # fmt: skip
def test_bad_article_options_exit_2_writing_nothing(
    articles_file: Path, tmp_path: Path, capsys, options, document, message
) -> None:
    if document is not None:
        write(articles_file, document)
    runs = tmp_path / "runs"
    args = ["train", "squad", "--task.train-file", str(articles_file), "--task.held-out-articles",
            "0.3", "--task.document", "article", *options, "--out-dir", str(runs)]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message.format(file=articles_file) in " ".join(err.replace("│", " ").split()), err
    if document is not None or "<=" in message:  # the data's checks: one line of relmem's
        assert len(err.strip().splitlines()) == 1 and err.startswith("relmem train: error: ")
    assert not runs.exists()
