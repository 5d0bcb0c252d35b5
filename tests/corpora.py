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
