"""Small hand-written corpora shared by the retrieval tests: one topic per passage."""

TOPICS = [
    ("Volcano", "A volcano is a rupture in a planet's crust through which lava, ash and gases erupt."),
    ("Piano", "The piano is a keyboard instrument whose hammers strike tuned strings."),
    ("Photosynthesis", "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar."),
    ("Glacier", "A glacier is a persistent body of dense ice that moves slowly under its own weight."),
    ("Chess", "Chess is a board game in which two players move kings, queens, rooks and pawns."),
    ("Honey bee", "Honey bees collect nectar from flowers and store honey in wax combs."),
    ("Lighthouse", "A lighthouse is a tower with a bright lamp that guides ships along the coast."),
    ("Sourdough", "Sourdough bread is leavened by wild yeast and lactic acid bacteria."),
]


def capitals_corpus():
    """Passages with exact ties (three identical twins) and a non-Latin title: the ranking tests of the
    position-only engines (Lucene, PISA)."""
    from capo_envs.retrieval.base import Passage

    return [
        Passage("paris", "Paris", "Paris is the capital and most populous city of France."),
        Passage("berlin", "Berlin", "Berlin is the capital and largest city of Germany."),
        Passage("danube", "Danube", "The Danube is the second-longest river in Europe, flowing through Vienna."),
        Passage("twin-a", "Twin", "An identical passage about lighthouses."),
        Passage("twin-b", "Twin", "An identical passage about lighthouses."),
        Passage("twin-c", "Twin", "An identical passage about lighthouses."),
        Passage("einstein", "Albert Einstein", "Einstein developed the theory of relativity."),
        Passage("tokyo", "東京", "東京は日本の首都です。 Tokyo is the capital of Japan."),
    ]


def lucene_or_skip():
    """``LuceneRetriever``, or a skip of the calling test when pyserini, pyjnius or Java is missing."""
    import pytest

    pytest.importorskip("pyserini")
    pytest.importorskip("jnius_config")  # not jnius: importing it starts the JVM before the jar is on its classpath
    from capo_envs.retrieval.lucene import LuceneRetriever, java_home

    try:
        java_home()
    except RuntimeError as e:
        pytest.skip(str(e))
    return LuceneRetriever
