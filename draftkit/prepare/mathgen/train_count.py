"""mathgen TRAIN templates: counting, sharing, fractions, ratios and scores (none appears in `eval_templates.py`).

A template takes a `G` (seeded choices) and returns (question, step lines, answer). Each step
writes its arithmetic as `expr = result` so tests can re-check every line. Numbers are drawn
so every division is exact and every answer is a non-negative integer.
"""

from __future__ import annotations

from draftkit.prepare.mathgen.phrasing import G, template_table

TEMPLATES, template = template_table()


@template
def sold_half_as_many(g: G):
    p, it = g.person(), g.item("craft")
    a = g.n(12, 96, 2)
    b = a // 2
    q = g.pick(
        f"{p} sold {a} {it.pl} in April, and then {p.he} sold half as many in May. How many "
        f"{it.pl} did {p} sell altogether in April and May?",
        f"In April {p} sold {a} handmade {it.pl}. In May {p.he} sold only half that number. "
        f"What is the total number of {it.pl} {p.he} sold over the two months?",
        f"{p} makes {it.pl} to sell. {p.He} sold {a} in the first month and half as many in "
        f"the second month. Find the total sold in both months.")
    return q, [f"{p} sold {a} / 2 = {b} {it.pl} in May.",
               f"Altogether {p.he} sold {a} + {b} = {a + b} {it.pl}."], a + b


@template
def give_away_fruit(g: G):
    p, f, it = g.person(), g.person(), g.item("fruit")
    k, each, to_friend = g.n(2, 5), g.n(2, 6), g.n(3, 10)
    left = g.n(1, 15)
    start = to_friend + k * each + left
    q = g.pick(
        f"{p} picked {start} {it.pl}. {p.He} gave {to_friend} to {f} and {each} to each of "
        f"{p.his} {k} cousins. How many {it.pl} does {p} have left?",
        f"{p} has {start} {it.pl}. After giving {f} {to_friend} {it.pl} and giving {k} "
        f"neighbors {each} {it.pl} each, how many are left?",
        f"There were {start} {it.pl} in {p}'s basket. {p.He} handed {to_friend} to {f}, then "
        f"{each} each to {k} classmates. How many {it.pl} remain in the basket?")
    given = k * each
    return q, [f"{p.He} gave away {k} * {each} = {given} {it.pl} to the group.",
               f"In all {p.he} gave {to_friend} + {given} = {to_friend + given} {it.pl}.",
               f"{p.He} has {start} - {to_friend + given} = {left} {it.pl} left."], left


@template
def groups_supplies(g: G):
    it = g.item("supply")
    size, groups, per = g.n(3, 6), g.n(4, 9), g.n(2, 5)
    students = size * groups
    q = g.pick(
        f"A class of {students} students is split into groups of {size}. Each group gets "
        f"{per} {it.pl}. How many {it.pl} does the teacher need?",
        f"There are {students} students, and the teacher puts them in groups of {size}. If "
        f"every group needs {per} {it.pl}, how many {it.pl} are needed in total?",
        f"{students} campers form teams of {size}. Each team receives {per} {it.pl}. Find the "
        f"number of {it.pl} handed out.")
    return q, [f"There are {students} / {size} = {groups} groups.",
               f"They need {groups} * {per} = {groups * per} {it.pl}."], groups * per


@template
def garden_fraction_lost(g: G):
    p, it = g.person(), g.item("plant")
    d = g.pick(3, 4, 5)
    rows, cols = g.n(3, 8), d * g.n(2, 6)
    total = rows * cols
    lost = total // d
    word = {3: "a third", 4: "a quarter", 5: "one fifth"}[d]
    q = g.pick(
        f"{p} plants {rows} rows of {it.pl} with {cols} in each row. A frost kills {word} of "
        f"them. How many {it.pl} survive?",
        f"In {p}'s garden there are {rows} rows with {cols} {it.pl} per row. If {word} of the "
        f"{it.pl} are eaten by rabbits, how many are left?",
        f"{p} set out {rows} rows of {cols} {it.pl}. {word.capitalize()} of them did not "
        f"grow. How many {it.pl} grew?")
    return q, [f"{p.He} planted {rows} * {cols} = {total} {it.pl}.",
               f"{total} / {d} = {lost} were lost.",
               f"{total} - {lost} = {total - lost} {it.pl} survive."], total - lost


@template
def pizza_slices_left(g: G):
    p = g.person()
    pizzas, slices = g.n(2, 6), g.pick(6, 8, 10, 12)
    people, each = g.n(3, 8), g.n(1, 3)
    total = pizzas * slices
    while people * each > total:
        people -= 1
    eaten = people * each
    q = g.pick(
        f"{p} orders {pizzas} pizzas, each cut into {slices} slices. {people} friends each eat "
        f"{each} slices. How many slices are left?",
        f"At {p}'s party there are {pizzas} pizzas with {slices} slices apiece. If {people} "
        f"guests eat {each} slices each, how many slices remain?",
        f"{pizzas} pizzas are cut into {slices} slices each. {people} people take {each} "
        f"slices each. What number of slices is left over?")
    return q, [f"There are {pizzas} * {slices} = {total} slices.",
               f"They eat {people} * {each} = {eaten} slices.",
               f"{total} - {eaten} = {total - eaten} slices are left."], total - eaten


@template
def bus_stops(g: G):
    start = g.n(15, 40)
    off1, on1 = g.n(2, 10), g.n(2, 12)
    mid = start - off1 + on1
    off2 = g.n(2, min(12, mid))
    on2 = g.n(2, 9)
    end = mid - off2 + on2
    vehicle = g.pick("bus", "train car", "ferry", "tram")
    q = g.pick(
        f"A {vehicle} leaves with {start} passengers. At the first stop {off1} get off and {on1} "
        f"get on. At the second stop {off2} get off and {on2} get on. How many passengers are on "
        f"the {vehicle} now?",
        f"There are {start} people on a {vehicle}. First {off1} people get off and {on1} get on; "
        f"later {off2} get off and {on2} get on. How many people are on board at the end?")
    return q, [f"After the first stop there are {start} - {off1} + {on1} = {mid} passengers.",
               f"After the second stop there are {mid} - {off2} + {on2} = {end} passengers."], end


@template
def ratio_split(g: G):
    p, it = g.person(), g.item("toy")
    a, b = g.pick((1, 2), (2, 3), (3, 4), (1, 3), (3, 5), (2, 5))
    unit = g.n(3, 15)
    total = (a + b) * unit
    q = g.pick(
        f"{p} has {total} {it.pl}, some red and some blue, in the ratio {a}:{b}. How many blue "
        f"{it.pl} does {p.he} have?",
        f"The ratio of red to blue {it.pl} in {p}'s box is {a} to {b}. There are {total} "
        f"{it.pl} in all. How many are blue?")
    return q, [f"There are {a} + {b} = {a + b} parts.",
               f"Each part is {total} / {a + b} = {unit} {it.pl}.",
               f"Blue {it.pl}: {b} * {unit} = {b * unit}."], b * unit


@template
def test_wrong_answers(g: G):
    p = g.person()
    q_n = g.pick(20, 25, 40, 50)
    pct = g.pick(*[c for c in (60, 64, 70, 75, 80, 85, 90, 96) if q_n * c % 100 == 0])
    right = q_n * pct // 100
    q = g.pick(
        f"{p} took a test with {q_n} questions and got {pct}% of them right. How many questions "
        f"did {p.he} get wrong?",
        f"On a {q_n}-question quiz, {p} answered {pct}% correctly. How many answers were wrong?")
    return q, [f"{p.He} got {q_n} * {pct} / 100 = {right} right.",
               f"{p.He} got {q_n} - {right} = {q_n - right} wrong."], q_n - right


@template
def jar_fractions(g: G):
    p, it = g.person(), g.item("snack")
    unit = g.n(2, 10)
    total = 12 * unit
    eaten = total // 3
    rest = total - eaten
    given = rest // 4
    left = rest - given
    q = g.pick(
        f"A jar has {total} {it.pl}. {p} eats a third of them and then gives away a quarter of "
        f"what is left. How many {it.pl} remain in the jar?",
        f"{p} baked {total} {it.pl}. The family ate 1/3 of them, and {p} gave 1/4 of the rest "
        f"to a neighbor. How many {it.pl} are left?")
    return q, [f"A third is {total} / 3 = {eaten}, leaving {total} - {eaten} = {rest}.",
               f"A quarter of {rest} is {rest} / 4 = {given}.",
               f"{rest} - {given} = {left} {it.pl} remain."], left


@template
def goodie_bags(g: G):
    p, it = g.person(), g.item("toy")
    kids, per, pack = g.n(6, 20), g.n(2, 5), g.pick(4, 5, 8, 10)
    need = kids * per
    while need % pack:
        kids += 1
        need = kids * per
    packs = need // pack
    q = g.pick(
        f"{p} is making goodie bags for {kids} kids with {per} {it.pl} in each bag. {it.Pl} come "
        f"in packs of {pack}. How many packs does {p.he} need?",
        f"For a birthday party, each of {kids} guests gets a bag with {per} {it.pl}. If {it.pl} "
        f"are sold {pack} to a pack, how many packs should {p} buy?")
    return q, [f"{p.He} needs {kids} * {per} = {need} {it.pl}.",
               f"That is {need} / {pack} = {packs} packs."], packs


@template
def farm_legs(g: G):
    p = g.person()
    birds, beasts = g.n(3, 25), g.n(2, 15)
    bird = g.pick("chickens", "ducks", "geese", "turkeys")
    beast = g.pick("cows", "goats", "sheep", "pigs", "horses")
    q = g.pick(
        f"{p}'s farm has {birds} {bird} and {beasts} {beast}. How many legs are there in total?",
        f"On a farm there are {birds} {bird} and {beasts} {beast}. Count all the animals' legs.")
    a, b = birds * 2, beasts * 4
    return q, [f"The {bird} have {birds} * 2 = {a} legs.", f"The {beast} have {beasts} * 4 = {b} legs.",
               f"In total there are {a} + {b} = {a + b} legs."], a + b


@template
def basketball_points(g: G):
    p = g.person()
    twos, threes, fts = g.n(2, 12), g.n(2, 6), g.n(2, 8)
    a, b = twos * 2, threes * 3
    q = g.pick(
        f"In a basketball game {p} made {twos} two-point shots, {threes} three-pointers and "
        f"{fts} free throws worth 1 point each. How many points did {p.he} score?",
        f"{p} scored {twos} baskets worth 2 points, {threes} worth 3 points and {fts} free "
        f"throws. What was {p.his} point total?")
    return q, [f"Two-pointers: {twos} * 2 = {a} points.", f"Three-pointers: {threes} * 3 = {b} points.",
               f"Total: {a} + {b} + {fts} = {a + b + fts} points."], a + b + fts


@template
def collection_growth(g: G):
    p = g.person()
    thing = g.pick("stamps", "coins", "seashells", "postcards", "baseball cards")
    start, per_month, months = g.n(10, 80), g.n(3, 15), g.n(2, 8)
    total = start + per_month * months
    if total % 2:
        start += 1
        total += 1
    q = g.pick(
        f"{p} has {start} {thing}. {p.He} adds {per_month} {thing} every month for {months} "
        f"months and then gives half of the collection to a friend. How many {thing} does "
        f"{p.he} keep?",
        f"{p}'s collection starts with {start} {thing} and grows by {per_month} each month. "
        f"After {months} months {p.he} donates half. How many {thing} are left?")
    added = per_month * months
    return q, [f"{p.He} adds {per_month} * {months} = {added} {thing}.",
               f"{p.He} then has {start} + {added} = {total} {thing}.",
               f"Half is {total} / 2 = {total // 2}, so {p.he} keeps {total // 2}."], total // 2


@template
def needed_test_score(g: G):
    p = g.person()
    n = g.pick(3, 4)
    target = g.n(75, 90)
    scores = [g.n(target - 12, 100) for _ in range(n)]
    need = target * (n + 1) - sum(scores)
    while not 0 <= need <= 100:
        scores = [g.n(target - 12, 100) for _ in range(n)]
        need = target * (n + 1) - sum(scores)
    listed = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    q = g.pick(
        f"{p} scored {listed} on {p.his} first {n} tests. What score does {p.he} need on the "
        f"next test to average exactly {target}?",
        f"{p}'s test scores so far are {listed}. To have an average of {target} after one more "
        f"test, what must {p.he} score?")
    total, have = target * (n + 1), sum(scores)
    return q, [f"{n + 1} tests averaging {target} total {target} * {n + 1} = {total} points.",
               f"{p.He} has {' + '.join(map(str, scores))} = {have} points.",
               f"{p.He} needs {total} - {have} = {need}."], need


@template
def marbles_trade(g: G):
    a, b, it = g.person(), g.person(), g.item("toy")
    x, y = g.n(20, 40), g.n(5, 18)
    give, get_back = g.n(2, 9), g.n(1, 6)
    ax, by = x - give + get_back, y + give - get_back
    more, less = (a, b) if ax >= by else (b, a)
    q = g.pick(
        f"{a} has {x} {it.pl} and {b} has {y}. {a} gives {b} {give} {it.pl}, and then {b} gives "
        f"{get_back} back. How many more {it.pl} does {more} have than {less} now?",
        f"{a} starts with {x} {it.pl}; {b} starts with {y}. After {a} hands {give} to {b} and "
        f"{b} returns {get_back}, what is the difference between their numbers of {it.pl}?")
    return q, [f"{a} now has {x} - {give} + {get_back} = {ax}.",
               f"{b} now has {y} + {give} - {get_back} = {by}.",
               f"The difference is {max(ax, by)} - {min(ax, by)} = {abs(ax - by)}."], abs(ax - by)
