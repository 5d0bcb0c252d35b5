"""SynthHouse's game generator: ALFWorld games written from scratch, for the real domain and grammar.

A game is what ``alfworld-generate`` writes (ALFWorld ``scripts/alfworld-generate``, alfworld 0.4.2):
``game.tw-pddl`` = {pddl_domain: alfred.pddl, grammar: alfred.twl2 with "UNKNOWN GOAL" replaced by the task
sentence, pddl_problem, solvable, walkthrough}, next to a ``traj_data.json`` holding ``task_type`` and
``pddl_params`` (what the handcoded expert and the loader read). The official problems come from replaying
ALFRED trajectories in AI2-THOR (``augment_pddl_states.py``), which cannot run offline; here the room is drawn
instead, from ALFWorld's own tables (``alfworld.gen.constants``):

- receptacles per room kind (kitchen, bathroom, bedroom, living room), each at its own location, ``openable``
  for ``OPENABLE_CLASS_LIST`` (Fridge, Cabinet, Microwave, Drawer, Safe, Box);
- objects placed only where ``VAL_RECEPTACLE_OBJECTS`` allows them, with ``heatable``/``coolable``/
  ``cleanable``/``sliceable``/``toggleable`` from ``VAL_ACTION_OBJECTS`` and ``canContain`` facts for every
  receptacle type and object type present;
- the goal from ``alfworld.gen.goal_library.gdict[task_type]['pddl']`` and the sentence from one of its two
  templates, picked with the task's own seeded ``random.Random`` (the official generator uses the unseeded
  global ``random`` there, so its sentence changes from run to run);
- names in THOR's mangled form (``Apple_bar__plus_01_dot_59_bar_...``, ``Sink_bar_..._bar_SinkBasin``), so
  ALFWorld's ``Demangler`` turns them into "apple 1", "sinkbasin 1" exactly as in the released games.

Choices that keep the handcoded expert (it matches names by substring) on its feet: no object type whose name
is a prefix of the target's or has the target's as a prefix (pen/pencil), no receptacle type whose name holds
the parent's (toilet/toiletpaperhanger), targets never start in the goal receptacle, the lamp of a
look-at-in-light task is a DeskLamp standing on a desk, side table or dresser. Not modelled: movable and sliced
tasks (the official loader skips them too), objects inside objects, the quirk that objects starting in the
fridge are already cool.

This module imports alfworld: it runs in the engine process (and in tests), never at ``import capo_envs``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import alfworld.gen.constants as constants
import alfworld.gen.goal_library as goal_library
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

# Receptacles a room of each kind may hold: type -> the most of that type (ALFWorld scenes: kitchens 1-30,
# living rooms 201-230, bedrooms 301-330, bathrooms 401-430; holders used by one object type only are left out).
ROOMS: dict[str, dict[str, int]] = {
    "kitchen": {
        "Cabinet": 6, "CounterTop": 2, "Drawer": 4, "Fridge": 1, "Microwave": 1, "SinkBasin": 1, "StoveBurner": 4,
        "DiningTable": 1, "GarbageCan": 1, "CoffeeMachine": 1, "Toaster": 1, "Shelf": 2, "SideTable": 1,
    },
    "bathroom": {
        "Cabinet": 4, "CounterTop": 1, "Drawer": 3, "SinkBasin": 2, "BathtubBasin": 1, "Toilet": 1, "GarbageCan": 1,
        "Shelf": 2, "Cart": 1,
    },
    "bedroom": {
        "Bed": 1, "Desk": 1, "Drawer": 4, "Dresser": 1, "Shelf": 3, "SideTable": 2, "GarbageCan": 1, "Safe": 1,
        "LaundryHamper": 1, "ArmChair": 1,
    },
    "livingroom": {
        "ArmChair": 2, "Sofa": 1, "CoffeeTable": 1, "SideTable": 2, "Drawer": 3, "Cabinet": 3, "Shelf": 3,
        "GarbageCan": 1, "Ottoman": 1, "Dresser": 1, "Safe": 1, "DiningTable": 1,
    },
}  # fmt: skip
# Where each task type happens (ALFWorld constants.GOALS_VALID).
TASK_ROOMS = {
    "pick_and_place_simple": ("kitchen", "livingroom", "bathroom", "bedroom"),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "livingroom", "bathroom", "bedroom"),
}
# The appliance a task needs, and the capability its target must have (VAL_ACTION_OBJECTS keys).
TASK_NEEDS = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}
LAMP = "DeskLamp"
LAMP_STANDS = ("Desk", "SideTable", "Dresser")
# Look-at-in-light targets: the small things ALFRED's bedroom and living-room tasks examine.
LOOK_TARGETS = (
    "AlarmClock", "Book", "Bowl", "Box", "CD", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Mug", "Newspaper",
    "Pen", "Pencil", "Pillow", "Plate", "RemoteControl", "Statue", "Vase", "Watch", "TissueBox", "BasketBall",
    "TennisRacket", "BaseballBat", "Cloth",
)  # fmt: skip

# Size knob: receptacles in the room, other objects, instances of the target type.
SIZES = {
    # micro: only the receptacles the task needs (the start, the goal, the appliance or lamp stand), one other
    # object; a CPU preset whose search takes 1-3 moves (configs/synthhouse.yaml, docs/envs/alfworld.md).
    "micro": {"receptacles": 3, "distractors": 1, "targets": (1, 1)},
    "tiny": {"receptacles": 5, "distractors": 3, "targets": (1, 2)},
    "small": {"receptacles": 8, "distractors": 8, "targets": (1, 2)},
    "medium": {"receptacles": 14, "distractors": 16, "targets": (1, 3)},
    "large": {"receptacles": 22, "distractors": 28, "targets": (2, 3)},
}

# A generated game is kept only if the handcoded expert wins it within this many steps (the engine process
# checks, as alfworld-generate's solvability check does), so it also wins within the default budget of 50.
EXPERT_BUDGET = 40

RTYPES = sorted(set(constants.RECEPTACLES) - set(constants.MOVABLE_RECEPTACLES))
OTYPES = sorted(set(constants.OBJECTS) - set(RTYPES))
CAN_HOLD = {r: set(objs) for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items()}
ACTION = {k: set(v) for k, v in constants.VAL_ACTION_OBJECTS.items()}
PICKUPABLE = sorted(
    {o for objs in CAN_HOLD.values() for o in objs if "Sliced" not in o} & set(OTYPES) - {"Towel", "HandTowel"}
)


@dataclass
class House:
    task_type: str
    room: str
    target: str
    parent: str  # "" for look-at-in-light
    toggle: str  # "" unless look-at-in-light
    receptacles: list[tuple[str, str, str]] = field(default_factory=list)  # (id, type, location)
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (id, type, receptacle id)
    start: str = ""
    sentence: str = ""


def _coord(rng: random.Random) -> str:
    value = rng.uniform(-3.0, 3.0)
    sign = "_plus_" if value >= 0 else "_minus_"
    whole, frac = divmod(round(abs(value) * 100), 100)
    return f"{sign}{whole:02d}_dot_{frac:02d}"


def _thor_id(rng: random.Random, cls: str, taken: set[str]) -> str:
    while True:
        base = f"{cls}_bar_{_coord(rng)}_bar_{_coord(rng)}_bar_{_coord(rng)}"
        if cls == "SinkBasin":
            base = f"Sink_bar_{_coord(rng)}_bar_{_coord(rng)}_bar_{_coord(rng)}_bar_SinkBasin"
        elif cls == "BathtubBasin":
            base = f"Bathtub_bar_{_coord(rng)}_bar_{_coord(rng)}_bar_{_coord(rng)}_bar_BathtubBasin"
        if base not in taken:
            taken.add(base)
            return base


def _location(rng: random.Random, taken: set[str]) -> str:
    def part(v: int) -> str:
        return f"_minus_{-v}" if v < 0 else str(v)

    while True:
        loc = "loc_bar_" + "_bar_".join(
            part(v) for v in (rng.randint(-8, 12), rng.randint(-8, 12), rng.randint(0, 3), rng.choice([-30, 0, 30, 45, 60]))
        )
        if loc not in taken:
            taken.add(loc)
            return loc


def _clashes(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a != b and (a.startswith(b) or b.startswith(a))


def draw_house(task_type: str, rng: random.Random, size: str = "small") -> House:
    """Draw a room, a task and a placement of objects for ``task_type`` (one of the six)."""
    if task_type not in TASK_ROOMS:
        raise ValueError(f"unknown task type {task_type!r}")
    knobs = SIZES[size]
    room = rng.choice(TASK_ROOMS[task_type])
    pool = ROOMS[room]
    appliance, capability = TASK_NEEDS.get(task_type, (None, None))

    # 1. The target, its goal receptacle (parent) and the lamp: the receptacles the task cannot do without.
    required: list[str] = [appliance] if appliance else []
    toggle = parent = ""
    if task_type == "look_at_obj_in_light":
        toggle = LAMP
        required.append(rng.choice([s for s in LAMP_STANDS if s in pool]))
        homes = [r for r in pool if any(t in CAN_HOLD.get(r, ()) for t in LOOK_TARGETS)]
        candidates = sorted({t for r in homes for t in LOOK_TARGETS if t in CAN_HOLD.get(r, ())})
        target = rng.choice(candidates)
    else:
        options = []
        for obj in PICKUPABLE:
            if capability and obj not in ACTION[capability]:
                continue
            holders = [r for r in pool if obj in CAN_HOLD.get(r, ())]
            for goal in holders:
                if goal == appliance or any(goal != other and goal.lower() in other.lower() for other in pool):
                    continue
                # The target must also be able to start somewhere other than a receptacle of the goal's type.
                if any(h != goal for h in holders):
                    options.append((obj, goal))
        target, parent = rng.choice(options)
        required.append(parent)
    starts = [r for r in pool if target in CAN_HOLD.get(r, ()) and r != parent]
    required.append(rng.choice(starts))

    # 2. Fill the room up to its size with more receptacles of its kind (never more of a type than it holds).
    counts: dict[str, int] = {}
    for r in required:
        counts[r] = counts.get(r, 0) + 1
    budget = max(knobs["receptacles"], len(required))
    while sum(counts.values()) < budget:
        free = [r for r, most in pool.items() if counts.get(r, 0) < most]
        if not free:
            break
        pick = rng.choice(free)
        counts[pick] = counts.get(pick, 0) + 1

    house = House(task_type, room, target, parent, toggle)
    ids: set[str] = set()
    locations: set[str] = set()
    for rtype in sorted(counts):
        for _ in range(counts[rtype]):
            house.receptacles.append((_thor_id(rng, rtype, ids), rtype, _location(rng, locations)))
    house.start = _location(rng, locations)

    # 3. Objects: the target instances away from the goal receptacle, the lamp, then distractors.
    def place(otype: str, allowed) -> None:
        homes = [rid for rid, rtype, _ in house.receptacles if allowed(rtype)]
        house.objects.append((_thor_id(rng, otype, ids), otype, rng.choice(homes)))

    low, high = knobs["targets"]
    n_targets = rng.randint(max(low, 2), max(high, 3)) if task_type == "pick_two_obj_and_place" else rng.randint(low, high)
    for _ in range(n_targets):
        place(target, lambda rtype: rtype != parent and target in CAN_HOLD.get(rtype, ()))
    if task_type == "pick_two_obj_and_place":
        # All instances start together: after delivering the first, the handcoded expert only goes back for a
        # second one it has seen (with them apart it loops between receptacles; observed).
        first = house.objects[-n_targets][2]
        house.objects[-n_targets:] = [(oid, otype, first) for oid, otype, _ in house.objects[-n_targets:]]
    if toggle:
        place(LAMP, lambda rtype: rtype in LAMP_STANDS)
    present = {rtype for _, rtype, _ in house.receptacles}
    extras = sorted(
        o for o in PICKUPABLE
        if o != target and not _clashes(o, target) and any(o in CAN_HOLD.get(r, ()) for r in present)
    )  # fmt: skip
    for _ in range(knobs["distractors"]):
        otype = rng.choice(extras)
        place(otype, lambda rtype, o=otype: o in CAN_HOLD.get(rtype, ()))

    template = rng.choice(goal_library.gdict[task_type]["templates"])
    house.sentence = template.format(obj=target.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    return house


def problem_text(house: House, name: str) -> str:
    """The PDDL problem, laid out like ALFWorld's initial_state.pddl files."""
    location_of = {rid: loc for rid, _, loc in house.receptacles}
    rtype_of = {rid: rtype for rid, rtype, _ in house.receptacles}
    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in OTYPES] + [f"{t}Type - rtype" for t in RTYPES]
    objects += [f"{oid} - object" for oid, _, _ in house.objects]
    objects += [f"{rid} - receptacle" for rid, _, _ in house.receptacles]
    objects += [f"{loc} - location" for loc in sorted({*location_of.values(), house.start})]

    init = [f"(atLocation agent1 {house.start})"]
    for rid, rtype, loc in house.receptacles:
        init += [f"(receptacleType {rid} {rtype}Type)", f"(receptacleAtLocation {rid} {loc})"]
        if rtype in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid})")
    for oid, otype, rid in house.objects:
        init += [f"(objectType {oid} {otype}Type)", f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {location_of[rid]})"]
        if otype != LAMP:
            init.append(f"(pickupable {oid})")
        for capability, predicate in (("Heatable", "heatable"), ("Coolable", "coolable"), ("Cleanable", "cleanable"),
                                      ("Sliceable", "sliceable"), ("Toggleable", "toggleable")):  # fmt: skip
            if otype in ACTION[capability]:
                init.append(f"({predicate} {oid})")
        if otype in constants.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {oid})")
    present_otypes = sorted({otype for _, otype, _ in house.objects})
    for rtype in sorted(set(rtype_of.values())):
        init += [f"(canContain {rtype}Type {o}Type)" for o in present_otypes if o in CAN_HOLD.get(rtype, ())]

    goal = goal_library.gdict[house.task_type]["pddl"].format(
        obj=house.target, recep=house.parent, toggle=house.toggle, mrecep=""
    ).replace("#", "-")
    return (
        f"\n(define (problem {name})\n(:domain alfred)\n(:objects\n"
        + "\n".join(f"        {o}" for o in objects)
        + "\n        )\n\n\n(:init\n\n"
        + "\n".join(f"        {f}" for f in init)
        + "\n)\n\n"
        + goal
    )


def traj_data(house: House, task_id: str) -> dict:
    """The part of ALFRED's traj_data.json that ALFWorld reads (task_type, pddl_params, an annotation)."""
    return {
        "task_id": task_id,
        "task_type": house.task_type,
        "pddl_params": {
            "object_target": house.target,
            "parent_target": house.parent,
            "toggle_target": house.toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": house.sentence[:1].upper() + house.sentence[1:] + "."}]},
        "scene": {"room": house.room, "generator": "capo_envs.alfworld.world"},
    }


_LOGIC: dict[str, str] = {}


def logic() -> dict[str, str]:
    """ALFWorld's domain and grammar as the installed wheel ships them (byte-identical to the release's logic/)."""
    if not _LOGIC:
        _LOGIC["domain"] = Path(ALFRED_PDDL_PATH).read_text(encoding="utf-8")
        _LOGIC["grammar"] = Path(ALFRED_TWL2_PATH).read_text(encoding="utf-8")
    return _LOGIC


def make_game(task_id: str, task_type: str, size: str = "small") -> tuple[dict, dict]:
    """The ``game.tw-pddl`` and ``traj_data.json`` contents of the task ``task_id`` (deterministic in the id)."""
    house = draw_house(task_type, random.Random(task_id), size)
    name = "synthhouse_" + "".join(c if c.isalnum() else "_" for c in task_id)
    game = {
        "pddl_domain": logic()["domain"],
        "grammar": logic()["grammar"].replace("UNKNOWN GOAL", house.sentence),
        "pddl_problem": problem_text(house, name),
        "solvable": True,  # by construction; tests/test_alfworld_synthhouse.py plays the expert on each task type
        "walkthrough": None,
    }
    return game, traj_data(house, task_id)
