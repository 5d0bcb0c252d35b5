"""SynthHop's entities, the relations between them, and the encyclopedic passages that state them.

Entities are generated in dependency order (countries, cities, people, then what people found and make),
so every year is consistent: a founder is an adult when founding, a film comes out after its director
grew up and its studio existed, an album after its band formed. A passage states its entity's own facts
and names the entities it links to; it never states facts *about* the linked entities, so a chain of
relations can only be followed one passage at a time, which is what makes a question multi-hop.

About one entity in five is a *twin* of an earlier one of its kind: its name shares the other's first
syllable and any common words ("Vellmoor Sky" / "Velltarn Sky"), its year falls in the same decade, and it
often shares the same city, studio or band. Twins are the distractors: they share words with gold
passages, so retrieval and reading are not trivial, yet each name's core word stays unique, so a BM25
query with the full name still ranks that entity's own passage first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, cast

from .names import Core, NameRegistry, between, invent_given_names, pick

KINDS = ("country", "city", "person", "company", "university", "band", "film", "album")  # generation order
KIND_SHARE = {
    "country": 0.03,
    "city": 0.14,
    "person": 0.33,
    "company": 0.10,
    "university": 0.05,
    "band": 0.08,
    "film": 0.15,
    "album": 0.12,
}
MIN_PER_KIND = 4  # even a very small world has a few of each, so comparisons always find pairs

# (relation, kind of the entity it points to); each relation is a function: one target per entity
RELATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "country": (("capital", "city"),),
    "city": (("country", "country"),),
    "person": (("birthplace", "city"),),
    "company": (("founder", "person"), ("headquarters", "city")),
    "university": (("founder", "person"), ("location", "city")),
    "band": (("founder", "person"), ("origin", "city")),
    "film": (("director", "person"), ("studio", "company")),
    "album": (("band", "band"),),
}
# the link a twin shares with its original half the time (look-alike towns always share their country)
TWIN_LINK = {
    "person": "birthplace",
    "company": "headquarters",
    "university": "location",
    "band": "origin",
    "film": "studio",
    "album": "band",
}
TWIN_SHARE = 0.2
TWIN_SAME_LINK = 0.5
MAX_PERSON_ROLES = 3  # a person founds or directs at most this many things: keeps their name a rare term
LAST_YEAR = 2024
OLDEST_LIVING_BIRTH_YEAR = 1940  # people born before this have died

GIVEN_NAMES_PER_PERSON = 1 / 15
RIVERS_PER_CITY = 1 / 3
FILM_WORDS = ("Sky", "Harbor", "Winter", "Echo", "Lantern", "Garden", "Horizon", "Crossing", "Tide", "Mirror",
              "Ember", "Frontier", "Summer", "Shadow", "Orchard", "Signal")  # fmt: skip
ALBUM_WORDS = ("Nights", "Letters", "Static", "Bloom", "Signals", "Velvet", "Anthems", "Postcards", "Weather",
               "Radio", "Stories", "Machines")  # fmt: skip
BAND_WORDS = ("Lanterns", "Ravens", "Engines", "Pilots", "Wolves", "Tigers", "Sparrows", "Brothers", "Arrows",
              "Keys")  # fmt: skip
COMPANY_WORDS = ("Industries", "Works", "Holdings", "Group", "Labs", "Motors", "Foods", "Systems", "Textiles",
                 "Shipping")  # fmt: skip
UNIVERSITY_FORMS = ("{} University", "{} College", "{} Institute of Technology")
RIVER_FORM = "{} River"
SHARED_WORDS = FILM_WORDS + ALBUM_WORDS + BAND_WORDS + COMPANY_WORDS + ("University", "College", "Institute",
                                                                       "Technology", "River")  # fmt: skip

OCCUPATIONS = ("painter", "architect", "novelist", "physicist", "composer", "engineer", "cartographer",
               "botanist", "sculptor", "economist", "poet", "chemist", "historian", "photographer")  # fmt: skip
ROLE_OCCUPATIONS = {
    "director": ("film director", "filmmaker"),
    "company": ("businessperson", "entrepreneur", "industrialist"),
    "band": ("singer", "guitarist", "musician"),
    "university": ("scholar", "philanthropist"),
}
INDUSTRIES = ("shipbuilding", "textile", "software", "food", "chemicals", "railway", "publishing", "mining",
              "glassware", "brewing", "aviation", "pharmaceutical")  # fmt: skip
FILM_GENRES = ("drama", "comedy", "thriller", "science fiction", "western", "musical", "documentary", "horror")
MUSIC_GENRES = ("rock", "folk", "jazz", "synth-pop", "punk", "blues", "electronic", "indie")
REGIONS = ("north", "south", "east", "west")
CITY_FEATURES = ("old harbour", "covered markets", "stone bridges", "botanical garden", "cathedral",
                 "textile mills", "annual lantern festival", "observatory")  # fmt: skip
ORDINALS = ("debut", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


@dataclass(slots=True)
class Entity:
    kind: str
    name: str
    core: Core
    year: int  # born / founded / formed / released / independent
    links: dict[str, int] = field(default_factory=dict)  # relation -> index of the target entity
    twin_of: int | None = None
    details: dict[str, object] = field(default_factory=dict)  # filler facts: nothing is asked about them


def kind_counts(n_passages: int) -> dict[str, int]:
    return {kind: max(MIN_PER_KIND, round(n_passages * KIND_SHARE[kind])) for kind in KINDS}


class WorldGenerator:
    """Draws every entity of a world in dependency order (see the module docstring)."""

    def __init__(self, rng: random.Random, n_passages: int):
        self.rng = rng
        self.counts = kind_counts(n_passages)
        self.given_names = invent_given_names(rng, max(12, round(self.counts["person"] * GIVEN_NAMES_PER_PERSON)))
        self.names = NameRegistry(rng, SHARED_WORDS + tuple(self.given_names))
        self.entities: list[Entity] = []
        self.by_kind: dict[str, list[int]] = {kind: [] for kind in KINDS}
        self.roles: dict[int, list[str]] = {}  # person -> what they founded or directed, in order
        self.rivers = [RIVER_FORM.format(self.names.core("river").word)
                       for _ in range(max(3, round(self.counts["city"] * RIVERS_PER_CITY)))]  # fmt: skip

    # ---- entities -------------------------------------------------------------------------------------

    def generate(self) -> list[Entity]:
        for kind in KINDS:
            make = getattr(self, f"_make_{kind}")
            for _ in range(self.counts[kind]):
                make()
        self._finish_people()
        self._number_albums()
        return self.entities

    def _twin_source(self, kind: str) -> int | None:
        pool = self.by_kind[kind]
        return pick(self.rng, pool) if pool and self.rng.random() < TWIN_SHARE else None

    def _year(self, lo: int, hi: int, twin: int | None) -> int:
        """A year in [lo, hi]; for a twin, in its original's decade but not its year, where that fits."""
        if twin is not None:
            other = self.entities[twin].year
            decade = other - other % 10
            choices = [y for y in range(max(lo, decade), min(hi, decade + 9) + 1) if y != other]
            if choices:
                return pick(self.rng, choices)
        return between(self.rng, lo, hi)

    def _add(self, kind: str, name_of: Callable[[str], str], core: Core, year: int, links: dict[str, int],
             twin: int | None, **details: object) -> int:  # fmt: skip
        index = len(self.entities)
        self.entities.append(Entity(kind, name_of(core.word), core, year, links, twin, details))
        self.by_kind[kind].append(index)
        return index

    def _core(self, kind: str, twin: int | None) -> Core:
        first = self.entities[twin].core.first_syllable if twin is not None else None
        return self.names.core(kind, first)

    def _link(self, kind: str, twin: int | None, default: int) -> int:
        """The twin's original's target for ``TWIN_LINK[kind]`` half the time, else ``default``."""
        if twin is not None and self.rng.random() < TWIN_SAME_LINK:
            return self.entities[twin].links[TWIN_LINK[kind]]
        return default

    def _word(self, twin: int | None, key: str, words: tuple[str, ...]) -> str:
        return str(self.entities[twin].details[key]) if twin is not None else pick(self.rng, words)

    def _any(self, kind: str) -> int:
        return pick(self.rng, self.by_kind[kind])

    def _pick_person(self, role: str, born_lo: int, born_hi: int) -> int:
        """Someone born in [born_lo, born_hi] with room for another role (rejection sampling)."""
        people = self.by_kind["person"]
        for _ in range(200):
            person = pick(self.rng, people)
            if born_lo <= self.entities[person].year <= born_hi and len(self.roles.get(person, ())) < MAX_PERSON_ROLES:
                self.roles.setdefault(person, []).append(role)
                return person
        raise RuntimeError(f"no person born {born_lo}-{born_hi} is free for another {role}")

    def _make_country(self) -> None:
        twin = self._twin_source("country")
        core = self._core("country", twin)
        self._add("country", str, core, self._year(1700, 1990, twin), {}, twin,
                  population_m=between(self.rng, 1, 90))  # fmt: skip

    def _make_city(self) -> None:
        countries = self.by_kind["country"]
        n_city = len(self.by_kind["city"])
        if n_city < len(countries):  # the first city of each country is its capital
            twin, country = None, countries[n_city]
        else:
            twin = self._twin_source("city")
            # look-alike towns lie in the same country
            country = self.entities[twin].links["country"] if twin is not None else self._any("country")
        core = self._core("city", twin)
        if twin is not None and self.rng.random() < TWIN_SAME_LINK:
            river = str(self.entities[twin].details["river"])
        else:
            river = pick(self.rng, self.rivers)
        index = self._add("city", str, core, self._year(700, 1850, twin), {"country": country}, twin,
                          river=river, population=between(self.rng, 8, 900) * 1000,
                          feature=pick(self.rng, CITY_FEATURES), region=pick(self.rng, REGIONS))  # fmt: skip
        if n_city < len(countries):
            self.entities[country].links["capital"] = index

    def _make_person(self) -> None:
        twin = self._twin_source("person")
        core = self._core("person", twin)
        given = self._word(twin, "given", tuple(self.given_names))
        born = self._year(1850, 1995, twin)
        birthplace = self._link("person", twin, self._any("city"))
        settled = self._any("city") if self.rng.random() < 0.4 else None
        self._add("person", lambda word: f"{given} {word}", core, born, {"birthplace": birthplace}, twin,
                  given=given, settled=settled)  # fmt: skip

    def _make_company(self) -> None:
        twin = self._twin_source("company")
        core = self._core("company", twin)
        word = self._word(twin, "word", COMPANY_WORDS)
        founder = self._pick_person("company", 1850, 1990)
        born = self.entities[founder].year
        year = self._year(born + 22, min(LAST_YEAR - 4, born + 50), twin)
        hq = self._link("company", twin, self._any("city"))
        self._add("company", lambda w: f"{w} {word}", core, year, {"founder": founder, "headquarters": hq}, twin,
                  word=word, industry=pick(self.rng, INDUSTRIES),
                  employees=between(self.rng, 2, 400) * 100)  # fmt: skip

    def _make_university(self) -> None:
        twin = self._twin_source("university")
        core = self._core("university", twin)
        form = self._word(twin, "form", UNIVERSITY_FORMS)
        founder = self._pick_person("university", 1850, 1980)
        born = self.entities[founder].year
        year = self._year(born + 30, min(LAST_YEAR - 10, born + 65), twin)
        location = self._link("university", twin, self._any("city"))
        self._add("university", form.format, core, year, {"founder": founder, "location": location}, twin,
                  form=form, public=self.rng.random() < 0.6, students=between(self.rng, 10, 400) * 100)  # fmt: skip

    def _make_band(self) -> None:
        twin = self._twin_source("band")
        core = self._core("band", twin)
        word = self._word(twin, "word", BAND_WORDS + ("",))
        founder = self._pick_person("band", 1920, 1995)
        born = self.entities[founder].year
        year = self._year(born + 16, min(LAST_YEAR - 2, born + 30), twin)
        origin = self._link("band", twin, self._any("city"))
        self._add("band", lambda w: f"{w} {word}".strip(), core, year, {"founder": founder, "origin": origin}, twin,
                  word=word, genre=pick(self.rng, MUSIC_GENRES))  # fmt: skip

    def _make_film(self) -> None:
        twin = self._twin_source("film")
        core = self._core("film", twin)
        word = self._word(twin, "word", FILM_WORDS)
        of_form = self.rng.random() < 0.3
        studio = self._link("film", twin, self._any("company"))
        for _ in range(200):
            director = self._pick_person("director", 1850, 1998)
            lo = max(self.entities[director].year + 24, self.entities[studio].year + 1)
            if lo <= LAST_YEAR:
                break
            self.roles[director].pop()  # too young for this studio's dates: give the role back
            studio = self._any("company")
        else:
            raise RuntimeError("no director and studio fit a film's dates")
        year = self._year(lo, min(LAST_YEAR, lo + 25), twin)
        self._add("film", (lambda w: f"{word} of {w}") if of_form else (lambda w: f"{w} {word}"), core, year,
                  {"director": director, "studio": studio}, twin, word=word,
                  genre=pick(self.rng, FILM_GENRES), minutes=between(self.rng, 80, 170),
                  shot_in=self._any("city") if self.rng.random() < 0.4 else None)  # fmt: skip

    def _make_album(self) -> None:
        twin = self._twin_source("album")
        core = self._core("album", twin)
        word = self._word(twin, "word", ALBUM_WORDS)
        band = self._link("album", twin, self._any("band"))
        formed = self.entities[band].year
        year = self._year(formed, min(LAST_YEAR, formed + 20), twin)
        self._add("album", lambda w: f"{w} {word}", core, year, {"band": band}, twin,
                  word=word, tracks=between(self.rng, 7, 16), recorded_in=self._any("city"))  # fmt: skip

    def _finish_people(self) -> None:
        """Occupations and deaths come last: an occupation follows the first role (a passage never calls a
        film director a botanist), and nobody dies before the last thing they founded or directed."""
        last_work: dict[int, int] = {}
        for entity in self.entities:
            for relation in ("founder", "director"):
                if relation in entity.links:
                    person = entity.links[relation]
                    last_work[person] = max(last_work.get(person, 0), entity.year)
        for person in self.by_kind["person"]:
            entity = self.entities[person]
            roles = self.roles.get(person)
            entity.details["occupation"] = pick(self.rng, ROLE_OCCUPATIONS[roles[0]] if roles else OCCUPATIONS)
            died = max(entity.year + between(self.rng, 50, 95), last_work.get(person, 0) + between(self.rng, 1, 15))
            entity.details["died"] = died if entity.year < OLDEST_LIVING_BIRTH_YEAR and died < LAST_YEAR else None

    def _number_albums(self) -> None:
        """Each band's albums in release order: the ordinal in a passage ("third studio album") is true."""
        by_band: dict[int, list[int]] = {}
        for album in self.by_kind["album"]:
            by_band.setdefault(self.entities[album].links["band"], []).append(album)
        for albums in by_band.values():
            for rank, album in enumerate(sorted(albums, key=lambda a: (self.entities[a].year, a))):
                self.entities[album].details["ordinal"] = ORDINALS[rank] if rank < len(ORDINALS) else None


# ---- passages ---------------------------------------------------------------------------------------------


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


class PassageWriter:
    """Encyclopedic prose, 2-5 sentences per entity, from varied templates.

    Each passage opens with the entity's name and names it (or its core word) again later: the repetition is
    what an encyclopedia does anyway, and it keeps the entity's own passage on top of a BM25 search for its
    name even when many other passages mention it once.
    """

    def __init__(self, rng: random.Random, entities: list[Entity], by_kind: dict[str, list[int]]):
        self.rng = rng
        self.entities = entities
        self.by_kind = by_kind

    def _one_of(self, options: tuple[str, ...]) -> str:
        return pick(self.rng, options)

    def write(self, index: int) -> str:
        entity = self.entities[index]
        return " ".join(getattr(self, f"_{entity.kind}")(index, entity))

    def _name(self, entity: Entity, relation: str) -> str:
        return self.entities[entity.links[relation]].name

    def _detail_name(self, entity: Entity, key: str) -> str:
        """The name of an entity a filler fact mentions (a city someone settled in, a film was shot in...)."""
        return self.entities[cast(int, entity.details[key])].name

    def _country(self, index: int, e: Entity) -> list[str]:
        n, capital, one_of = e.name, self._name(e, "capital"), self._one_of
        sentences = [
            one_of((f"{n} is a country whose capital is {capital}.",
                    f"{n} is a sovereign state with its capital at {capital}.",
                    f"{n} is a country; its capital and largest city is {capital}.")),
            one_of((f"{n} became independent in {e.year}.", f"{n} gained independence in {e.year}.")),
        ]  # fmt: skip
        neighbour = pick(self.rng, self.by_kind["country"])
        if neighbour != index and self.rng.random() < 0.5:
            sentences.append(f"{n} borders {self.entities[neighbour].name}.")
        sentences.append(f"{n} has a population of about {e.details['population_m']} million.")
        return sentences

    def _city(self, index: int, e: Entity) -> list[str]:
        n, country, one_of, d = e.name, self._name(e, "country"), self._one_of, e.details
        if self.entities[e.links["country"]].links["capital"] == index:
            opening = one_of((f"{n} is the capital of {country}.",
                              f"{n} is the capital and largest city of {country}."))  # fmt: skip
        else:
            opening = one_of((f"{n} is a city in {country}.", f"{n} is a town in the {d['region']} of {country}."))
        sentences = [
            opening,
            one_of((f"{n} was founded in {e.year}.", f"{n} was established in {e.year}.")),
            one_of((f"{n} lies on the {d['river']}.", f"{n} stands on the banks of the {d['river']}.")),
            one_of((f"It has a population of about {d['population']:,}.", f"It is known for its {d['feature']}.")),
        ]
        return sentences[: between(self.rng, 3, 4)]

    def _person(self, index: int, e: Entity) -> list[str]:
        n, s, city, one_of, d = e.name, e.core.word, self._name(e, "birthplace"), self._one_of, e.details
        be = "was" if d["died"] else "is"
        occupation = _a(str(d["occupation"]))
        sentences = [
            one_of((f"{n} (born {e.year} in {city}) {be} {occupation}.",
                    f"{n} {be} {occupation} who was born in {city} in {e.year}.",
                    f"{n} {be} {occupation}, born in {e.year} in the city of {city}.")),
        ]  # fmt: skip
        if d["settled"] is not None and d["settled"] != e.links["birthplace"]:
            settled = self._detail_name(e, "settled")
            sentences.append(one_of((f"{s} later settled in {settled}.", f"As an adult, {s} moved to {settled}.")))
        sentences.append(one_of((f"{s} {be} known for a meticulous working style.", f"{s} gave few interviews.",
                                 f"{s} kept detailed diaries.",
                                 f"The early work of {s} drew little attention.")))  # fmt: skip
        if d["died"]:
            sentences.append(f"{s} died in {d['died']}.")
        return sentences

    def _company(self, index: int, e: Entity) -> list[str]:
        n, s, founder, one_of, d = e.name, e.core.word, self._name(e, "founder"), self._one_of, e.details
        industry, hq = _a(str(d["industry"])), self._name(e, "headquarters")
        return [
            one_of((f"{n} is {industry} company founded in {e.year} by {founder}.",
                    f"{n} is {industry} company that {founder} founded in {e.year}.",
                    f"{n} was founded by {founder} in {e.year} as {industry} business.")),
            one_of((f"It is headquartered in {hq}.", f"{s} has its headquarters in {hq}.",
                    f"The company is based in {hq}.")),
            one_of((f"{s} employs about {d['employees']:,} people.",
                    f"{s} exports to several neighbouring countries.")),
        ]  # fmt: skip

    def _university(self, index: int, e: Entity) -> list[str]:
        n, founder, city, d = e.name, self._name(e, "founder"), self._name(e, "location"), e.details
        one_of = self._one_of
        status = "public" if d["public"] else "private"
        return [
            one_of((f"{n} is a {status} university in {city}.",
                    f"{n} is a {status} research university located in {city}.")),
            one_of((f"It was founded in {e.year} by {founder}.", f"{founder} founded {n} in {e.year}.",
                    f"The university was founded by {founder} in {e.year}.")),
            one_of((f"{n} has about {d['students']:,} students.", f"{n} is known for its library of old maps.")),
        ]  # fmt: skip

    def _band(self, index: int, e: Entity) -> list[str]:
        n, founder, origin, one_of = e.name, self._name(e, "founder"), self._name(e, "origin"), self._one_of
        genre = _a(str(e.details["genre"]))
        return [
            one_of((f"{n} is {genre} band formed in {origin} in {e.year}.",
                    f"{n} is {genre} band from {origin}, formed in {e.year}.")),
            one_of((f"The band was founded by {founder}.", f"{founder} founded {n}.",
                    f"{n} was started by {founder}.")),
            one_of((f"{n} toured widely in the following decade.",
                    f"{n} released a first single a year after forming.")),
        ]  # fmt: skip

    def _film(self, index: int, e: Entity) -> list[str]:
        n, director, studio, one_of = e.name, self._name(e, "director"), self._name(e, "studio"), self._one_of
        genre = str(e.details["genre"])
        sentences = [
            one_of((f"{n} is a {e.year} {genre} film directed by {director}.",
                    f"{n} is {_a(genre)} film released in {e.year} and directed by {director}.",
                    f"{n} is {_a(genre)} film by {director}, released in {e.year}.")),
            one_of((f"It was produced by {studio}.", f"{studio} produced the film.",
                    f"The film was produced by {studio}.")),
            f"{n} runs {e.details['minutes']} minutes.",
        ]  # fmt: skip
        if e.details["shot_in"] is not None:
            sentences.append(f"Parts of {n} were shot in {self._detail_name(e, 'shot_in')}.")
        return sentences

    def _album(self, index: int, e: Entity) -> list[str]:
        n, band, ordinal = e.name, self._name(e, "band"), e.details["ordinal"]
        if ordinal:
            opening = self._one_of((f"{n} is the {ordinal} studio album by {band}, released in {e.year}.",
                                    f"{n} is the {ordinal} album by the band {band}, released in {e.year}."))  # fmt: skip
        else:
            opening = f"{n} is a studio album by {band}, released in {e.year}."
        return [
            opening,
            self._one_of((f"{n} contains {e.details['tracks']} tracks.",
                          f"{n} was recorded in {self._detail_name(e, 'recorded_in')}.")),
        ]  # fmt: skip
