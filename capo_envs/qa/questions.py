"""SynthHop questions: bridge chains of 2-4 hops and two-entity comparisons, each with one right answer.

A bridge question names only its first entity and describes the rest by relations ("the founder of the
company that produced the film Vellmoor Sky"), so answering takes one search per entity of the chain: the
answer is a fact stated in the last passage, and every relation is a function (one director per film,
one birthplace per person), so the chain and its answer are unique. A comparison names two entities of
one kind and asks which came first (their years never tie) or whether they share a city, country, studio,
director or band (yes/no, half each).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .metrics import normalize_answer
from .names import pick
from .entities import RELATIONS, Entity

BRIDGE_KINDS = ("bridge-2", "bridge-3", "bridge-4")
QUESTION_KINDS = BRIDGE_KINDS + ("comparison",)
ATTEMPTS_PER_QUESTION = 50  # draws before a world is declared too small for the questions asked of it

CLAUSE_MARKERS = (" where ", " that ", " who ")
# how a question names its first entity
LABELS = {"film": "the film {}", "album": "the album {}", "band": "the band {}"}
# (kind, relation) -> noun phrases for "the target of {x}"
RELATION_PHRASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("film", "director"): ("the director of {x}", "the person who directed {x}"),
    ("film", "studio"): ("the company that produced {x}", "the studio behind {x}"),
    ("album", "band"): ("the band that recorded {x}", "the band behind {x}"),
    ("band", "founder"): ("the founder of {x}", "the person who founded {x}"),
    ("band", "origin"): ("the city where {x} was formed", "the hometown of {x}"),
    ("company", "founder"): ("the founder of {x}", "the person who founded {x}"),
    ("company", "headquarters"): ("the city where {x} is headquartered", "the headquarters city of {x}"),
    ("university", "founder"): ("the founder of {x}", "the person who founded {x}"),
    ("university", "location"): ("the city where {x} is located", "the home city of {x}"),
    ("person", "birthplace"): ("the birthplace of {x}", "the city where {x} was born"),
    ("city", "country"): ("the country where {x} lies", "the country that contains {x}"),
    ("country", "capital"): ("the capital of {x}", "the capital city of {x}"),
}
# (kind, what is asked) -> the question; "year" and "river" are attributes, the rest are relations.
# Every entry has a template ending in "{x}?", used when {x} already holds a clause (see _template).
ASK_PHRASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("person", "year"): ("In which year was {x} born?", "When was {x} born?", "What is the birth year of {x}?"),
    ("person", "birthplace"): ("In which city was {x} born?", "Where was {x} born?", "What is the birthplace of {x}?"),
    ("city", "year"): ("In which year was {x} founded?", "When was {x} founded?", "What is the founding year of {x}?"),
    ("city", "river"): ("Which river flows through {x}?", "On which river does {x} lie?"),
    ("city", "country"): ("In which country is {x}?", "In which country does {x} lie?"),
    ("country", "year"): ("In which year did {x} become independent?", "When did {x} gain independence?",
                        "What is the year of independence of {x}?"),
    ("country", "capital"): ("What is the capital of {x}?", "Which city is the capital of {x}?"),
    ("company", "year"): ("In which year was {x} founded?", "When was {x} founded?",
                        "What is the founding year of {x}?"),
    ("company", "founder"): ("Who founded {x}?", "Who is the founder of {x}?"),
    ("company", "headquarters"): ("In which city is {x} headquartered?", "Where is {x} based?",
                                 "What is the headquarters city of {x}?"),
    ("university", "year"): ("In which year was {x} founded?", "When was {x} founded?",
                        "What is the founding year of {x}?"),
    ("university", "founder"): ("Who founded {x}?", "Who is the founder of {x}?"),
    ("university", "location"): ("In which city is {x} located?", "Which city is home to {x}?"),
    ("band", "year"): ("In which year was {x} formed?", "When was {x} formed?", "What is the founding year of {x}?"),
    ("band", "founder"): ("Who founded {x}?", "Who started {x}?"),
    ("band", "origin"): ("In which city was {x} formed?", "Where was {x} formed?", "What is the hometown of {x}?"),
    ("film", "year"): ("In which year was {x} released?", "When was {x} released?", "What is the release year of {x}?"),
    ("film", "director"): ("Who directed {x}?",),
    ("film", "studio"): ("Which company produced {x}?",),
    ("album", "year"): ("In which year was {x} released?", "When did {x} come out?",
                      "What is the release year of {x}?"),
    ("album", "band"): ("Which band recorded {x}?",),
}
# kind -> (questions whose answer is the earlier one, questions whose answer is the later one)
ORDER_PHRASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "person": (("Who was born first, {a} or {b}?", "Who is older, {a} or {b}?"),
               ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?")),
    "city": (("Which city was founded first, {a} or {b}?", "Which city is older, {a} or {b}?"),
             ("Which city was founded more recently, {a} or {b}?",)),
    "country": (("Which country became independent first, {a} or {b}?",),
                ("Which country became independent later, {a} or {b}?",)),
    "company": (("Which company was founded first, {a} or {b}?", "Which is older, {a} or {b}?"),
                ("Which company was founded more recently, {a} or {b}?",)),
    "university": (("Which university was founded first, {a} or {b}?",),
                   ("Which university was founded more recently, {a} or {b}?",)),
    "band": (("Which band was formed first, {a} or {b}?",), ("Which band was formed more recently, {a} or {b}?",)),
    "film": (("Which film was released first, {a} or {b}?", "Which film came out earlier, {a} or {b}?"),
             ("Which film was released later, {a} or {b}?",)),
    "album": (("Which album was released first, {a} or {b}?",), ("Which album came out later, {a} or {b}?",)),
}  # fmt: skip
# (kind, relation) -> yes/no questions: do the two entities share the relation's target?
SAME_PHRASES: dict[tuple[str, str], tuple[str, ...]] = {
    ("person", "birthplace"): ("Were {a} and {b} born in the same city?",),
    ("city", "country"): ("Are {a} and {b} in the same country?",),
    ("company", "headquarters"): ("Are {a} and {b} headquartered in the same city?",),
    ("university", "location"): ("Are {a} and {b} in the same city?",),
    ("band", "origin"): ("Were the bands {a} and {b} formed in the same city?",),
    ("film", "director"): ("Were the films {a} and {b} directed by the same person?",),
    ("film", "studio"): ("Were the films {a} and {b} produced by the same company?",),
    ("album", "band"): ("Were the albums {a} and {b} recorded by the same band?",),
}
# comparisons cycle through these, so order / yes / no questions come in a fixed 2:1:1 proportion
COMPARISON_CYCLE = ("order", "yes", "order", "no")


@dataclass(frozen=True)
class Question:
    kind: str  # one of QUESTION_KINDS
    text: str
    answers: tuple[str, ...]  # gold first
    titles: tuple[str, ...]  # the supporting passages in hop order; also the oracle's queries
    comparison: str = ""  # "earlier", "later" or "same"; empty for bridges
    facts: tuple[tuple[str, str], ...] = ()  # comparisons: (title, the compared value as its passage states it)


class QuestionGenerator:
    """Draws questions over a world; no two questions anywhere share an entity chain."""

    def __init__(self, rng: random.Random, entities: list[Entity], by_kind: dict[str, list[int]]):
        self.rng = rng
        self.entities = entities
        self.by_kind = by_kind
        self.kinds = [kind for kind in by_kind if by_kind[kind]]
        self.seen: set[tuple[str, ...]] = set()  # entity chains already asked about (membership only)
        self.sharing: dict[tuple[str, str], dict[int, list[int]]] = {key: {} for key in SAME_PHRASES}
        for kind, relation in SAME_PHRASES:
            for index in by_kind[kind]:
                self.sharing[kind, relation].setdefault(entities[index].links[relation], []).append(index)
        self.n_comparisons = 0

    def generate(self, kind: str, count: int) -> list[Question]:
        draw = self._comparison if kind == "comparison" else lambda: self._bridge(BRIDGE_KINDS.index(kind) + 2)
        questions: list[Question] = []
        for _ in range(count * ATTEMPTS_PER_QUESTION):
            if len(questions) == count:
                break
            question = draw()
            if question is not None:
                questions.append(question)
        if len(questions) < count:
            raise RuntimeError(f"found only {len(questions)} of {count} {kind} questions: the world is too small")
        return questions

    def _claim(self, key: tuple[str, ...]) -> bool:
        """Reserve an entity chain; False when some question already uses it."""
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def _bridge(self, hops: int) -> Question | None:
        rng, entities = self.rng, self.entities
        start_kind = pick(rng, self.kinds)
        chain = [pick(rng, self.by_kind[start_kind])]
        relations: list[str] = []
        for _ in range(hops - 1):
            entity = entities[chain[-1]]
            options = [r for r, _ in RELATIONS[entity.kind] if entity.links[r] not in chain]
            if not options:
                return None
            relation = pick(rng, options)
            relations.append(relation)
            chain.append(entity.links[relation])
        last = entities[chain[-1]]
        asks = ["year"] + [r for r, _ in RELATIONS[last.kind] if last.links[r] not in chain]
        if last.kind == "city":
            asks.append("river")
        ask = pick(rng, asks)
        if ask == "year":
            answers: tuple[str, ...] = (str(last.year),)
        elif ask == "river":
            river = str(last.details["river"])
            answers = (river, river.split()[0])
        else:
            answers = (entities[last.links[ask]].name,)
        phrase = LABELS.get(start_kind, "{}").format(entities[chain[0]].name)
        for index, relation in zip(chain, relations):
            phrase = self._template(RELATION_PHRASES[entities[index].kind, relation], phrase).format(x=phrase)
        text = self._template(ASK_PHRASES[last.kind, ask], phrase).format(x=phrase)
        titles = tuple(entities[index].name for index in chain)
        if f" {normalize_answer(answers[0])} " in f" {normalize_answer(text)} " or not self._claim(titles):
            return None
        return Question(f"bridge-{hops}", text, answers, titles)

    def _template(self, templates: tuple[str, ...], phrase: str) -> str:
        """A random template; once ``phrase`` holds a relative clause, one that ends with it.

        "the birthplace of the person who founded X" reads well; "the city where the person who founded X
        was born" nests a clause in a clause, which is hard to parse for people and small models alike.
        """
        if any(marker in phrase for marker in CLAUSE_MARKERS):
            templates = tuple(t for t in templates if t.rstrip("?").endswith("{x}")) or templates
        return pick(self.rng, templates)

    def _comparison(self) -> Question | None:
        slot = COMPARISON_CYCLE[self.n_comparisons % len(COMPARISON_CYCLE)]
        question = self._order() if slot == "order" else self._same(slot == "yes")
        if question is not None:
            self.n_comparisons += 1
        return question

    def _claim_pair(self, a: int, b: int) -> bool:
        return self._claim(tuple(sorted((self.entities[a].name, self.entities[b].name))))

    def _order(self) -> Question | None:
        """Which came first (or last)? Half the time the pair is a twin and its original: same decade."""
        rng, entities = self.rng, self.entities
        kind = pick(rng, self.kinds)
        a = pick(rng, self.by_kind[kind])
        twin = entities[a].twin_of
        b = twin if twin is not None and rng.random() < 0.5 else pick(rng, self.by_kind[kind])
        if a == b or entities[a].year == entities[b].year:
            return None
        if rng.random() < 0.5:
            a, b = b, a
        comparison = pick(rng, ("earlier", "later"))
        first, last = sorted((a, b), key=lambda index: entities[index].year)
        answer = entities[first if comparison == "earlier" else last].name
        template = pick(rng, ORDER_PHRASES[kind][comparison == "later"])
        if not self._claim_pair(a, b):
            return None
        return Question(
            "comparison",
            template.format(a=entities[a].name, b=entities[b].name),
            (answer,),
            (entities[a].name, entities[b].name),
            comparison,
            ((entities[a].name, str(entities[a].year)), (entities[b].name, str(entities[b].year))),
        )

    def _same(self, yes: bool) -> Question | None:
        rng, entities = self.rng, self.entities
        kind, relation = pick(rng, list(SAME_PHRASES))
        a = pick(rng, self.by_kind[kind])
        target = entities[a].links[relation]
        if yes:
            others = [index for index in self.sharing[kind, relation][target] if index != a]
            if not others:
                return None
            b = pick(rng, others)
        else:
            b = pick(rng, self.by_kind[kind])
            if entities[b].links[relation] == target:
                return None
        if rng.random() < 0.5:
            a, b = b, a
        if not self._claim_pair(a, b):
            return None
        return Question(
            "comparison",
            pick(rng, SAME_PHRASES[kind, relation]).format(a=entities[a].name, b=entities[b].name),
            ("yes" if yes else "no",),
            (entities[a].name, entities[b].name),
            "same",
            tuple((entities[i].name, entities[entities[i].links[relation]].name) for i in (a, b)),
        )
