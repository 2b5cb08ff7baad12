"""mathgen TRAIN templates: distance, time, area, rates, averages and ages (none appears in `eval_templates.py`).

A template takes a `G` (seeded choices) and returns (question, step lines, answer). Each step
writes its arithmetic as `expr = result` so tests can re-check every line. Numbers are drawn
so every division is exact and every answer is a non-negative integer.
"""

from __future__ import annotations

from draftkit.prepare.mathgen.phrasing import G, money, template_table

TEMPLATES, template = template_table()


@template
def book_pages_left(g: G):
    p = g.person()
    per_day, days = g.n(8, 30), g.n(3, 7)
    extra = g.n(10, 60)
    read = per_day * days
    left = g.n(20, 150)
    total = read + extra + left
    q = g.pick(
        f"{p}'s book has {total} pages. {p.He} reads {per_day} pages a day for {days} days and "
        f"then {extra} pages on the weekend. How many pages are left?",
        f"A novel is {total} pages long. {p} read {per_day} pages each day for {days} days, then "
        f"read another {extra} pages. How many pages does {p.he} still have to read?",
        f"{p} is reading a {total}-page book. After reading {per_day} pages daily for {days} "
        f"days and {extra} more pages on Sunday, how many pages remain?")
    return q, [f"{p.He} read {per_day} * {days} = {read} pages on weekdays.",
               f"{p.He} read {read} + {extra} = {read + extra} pages in total.",
               f"There are {total} - {read + extra} = {left} pages left."], left


@template
def recipe_scaling(g: G):
    p, it = g.person(), g.item("snack")
    batch = g.n(12, 24, 6)
    cups = g.n(2, 4)
    times = g.n(2, 6)
    want = batch * times
    q = g.pick(
        f"A recipe uses {cups} cups of flour to make {batch} {it.pl}. {p} wants to bake "
        f"{want} {it.pl} for a party. How many cups of flour does {p.he} need?",
        f"{p} needs {cups} cups of flour for every {batch} {it.pl}. How many cups of flour are "
        f"needed to bake {want} {it.pl}?",
        f"To make {want} {it.pl}, how much flour will {p} use if {batch} {it.pl} take {cups} cups?")
    return q, [f"{want} {it.pl} is {want} / {batch} = {times} batches.",
               f"{p.He} needs {times} * {cups} = {times * cups} cups of flour."], times * cups


@template
def two_leg_trip(g: G):
    p = g.person()
    s1, h1 = g.n(30, 70, 5), g.n(2, 5)
    s2, h2 = g.n(20, 65, 5), g.n(1, 4)
    d1, d2 = s1 * h1, s2 * h2
    unit = g.pick("miles", "kilometers")
    per = "mph" if unit == "miles" else "km/h"
    q = g.pick(
        f"{p} drives at {s1} {per} for {h1} hours and then at {s2} {per} for {h2} hours. How "
        f"many {unit} does {p.he} drive in total?",
        f"On a road trip, {p} travels {h1} hours at {s1} {per}, stops for lunch, and then "
        f"drives {h2} more hours at {s2} {per}. What is the total distance in {unit}?",
        f"Find the total distance {p} covers by driving {h1} hours at {s1} {per} and {h2} "
        f"hours at {s2} {per}.")
    return q, [f"The first part is {s1} * {h1} = {d1} {unit}.",
               f"The second part is {s2} * {h2} = {d2} {unit}.",
               f"The total is {d1} + {d2} = {d1 + d2} {unit}."], d1 + d2


@template
def three_ages(g: G):
    a, b, c = g.person(), g.person(), g.person()
    c_age, k, diff = g.n(3, 12), g.n(2, 3), g.n(2, 9)
    b_age = c_age * k
    a_age = b_age + diff
    word = {2: "twice", 3: "three times"}[k]
    q = g.pick(
        f"{a} is {diff} years older than {b}. {b} is {word} as old as {c}. If {c} is {c_age} "
        f"years old, what is the sum of their ages?",
        f"{c} is {c_age}. {b} is {word} {c}'s age, and {a} is {diff} years older than {b}. How "
        f"old are the three of them together?",
        f"If {c} is {c_age} years old, {b} is {word} as old as {c}, and {a} is {diff} years "
        f"older than {b}, find the total of all three ages.")
    total = a_age + b_age + c_age
    return q, [f"{b} is {c_age} * {k} = {b_age} years old.",
               f"{a} is {b_age} + {diff} = {a_age} years old.",
               f"Together they are {a_age} + {b_age} + {c_age} = {total} years old."], total


@template
def fence_cost(g: G):
    p = g.person()
    length, width, cost = g.n(8, 40), g.n(5, 25), g.n(3, 15)
    per = 2 * (length + width)
    q = g.pick(
        f"{p}'s rectangular yard is {length} meters long and {width} meters wide. Fencing costs "
        f"{money(cost)} per meter. How much will it cost to fence the whole yard?",
        f"A rectangular garden measures {length} m by {width} m. If fence costs {money(cost)} a "
        f"meter, what does {p} pay to put a fence around it?",
        f"How much does it cost {p} to fence a {length} meter by {width} meter rectangular "
        f"field at {money(cost)} per meter?")
    return q, [f"The perimeter is 2 * ({length} + {width}) = {per} meters.",
               f"The fence costs {per} * {cost} = ${per * cost}."], per * cost


@template
def floor_tiles_boxes(g: G):
    p = g.person()
    box = g.pick(10, 12, 20, 25)
    boxes = g.n(3, 12)
    area = box * boxes
    width = g.pick(*[w for w in range(4, 16) if area % w == 0] or [1])
    length = area // width
    q = g.pick(
        f"{p} is tiling a floor that is {length} feet long and {width} feet wide. One tile "
        f"covers 1 square foot, and tiles come in boxes of {box}. How many boxes does {p.he} need?",
        f"A room measures {length} ft by {width} ft. Tiles are 1 square foot each and are sold "
        f"in boxes of {box}. How many boxes of tiles must {p} buy?",
        f"Find how many boxes of {box} one-foot-square tiles {p} needs to cover a {length} by "
        f"{width} foot floor.")
    return q, [f"The floor is {length} * {width} = {area} square feet.",
               f"{p.He} needs {area} / {box} = {boxes} boxes."], boxes


@template
def chores_hours(g: G):
    p = g.person()
    minutes, per_day, days = g.pick(10, 15, 20, 30), g.n(2, 6), g.n(3, 7)
    total = minutes * per_day * days
    while total % 60:
        days += 1
        total = minutes * per_day * days
    task = g.pick("practice piano pieces", "walk dogs", "clean rooms", "tutor students")
    q = g.pick(
        f"{p} spends {minutes} minutes on each session and does {per_day} sessions a day to "
        f"{task}. How many hours does {p.he} spend over {days} days?",
        f"Each session to {task} takes {p} {minutes} minutes. If {p.he} does {per_day} sessions a "
        f"day for {days} days, how many hours is that?")
    per = minutes * per_day
    return q, [f"Each day takes {minutes} * {per_day} = {per} minutes.",
               f"Over {days} days that is {per} * {days} = {total} minutes.",
               f"{total} / 60 = {total // 60} hours."], total // 60


@template
def tank_fill_time(g: G):
    rate, minutes = g.n(2, 12), g.n(5, 40)
    have = g.n(10, 200, 10)
    cap = have + rate * minutes
    what = g.pick("water tank", "pool", "rain barrel", "fish tank")
    q = g.pick(
        f"A {what} holds {cap} liters and already has {have} liters in it. A hose adds {rate} "
        f"liters per minute. How many minutes until the {what} is full?",
        f"How long, in minutes, does it take to fill a {cap}-liter {what} that already holds "
        f"{have} liters if water flows in at {rate} liters a minute?")
    need = cap - have
    return q, [f"It needs {cap} - {have} = {need} more liters.",
               f"That takes {need} / {rate} = {minutes} minutes."], minutes


@template
def weekly_steps(g: G):
    p = g.person()
    wd, we = g.n(4, 12) * 1000, g.n(2, 15) * 1000
    a, b = 5 * wd, 2 * we
    q = g.pick(
        f"{p} walks {wd} steps every weekday and {we} steps on each weekend day. How many steps "
        f"does {p.he} walk in a week?",
        f"On each of the 5 weekdays {p} takes {wd} steps, and on Saturday and Sunday {p.he} "
        f"takes {we} steps each day. What is {p.his} weekly total?")
    return q, [f"Weekdays: 5 * {wd} = {a} steps.", f"Weekend: 2 * {we} = {b} steps.",
               f"Total: {a} + {b} = {a + b} steps."], a + b


@template
def movie_marathon(g: G):
    p = g.person()
    a, b, c = g.n(85, 150), g.n(85, 150), g.n(85, 150)
    brk = g.n(5, 20, 5)
    films, pauses = a + b + c, 2 * brk
    q = g.pick(
        f"{p} watches three movies that last {a}, {b} and {c} minutes, with a {brk}-minute "
        f"break between movies. How many minutes does the movie marathon take?",
        f"During a movie night, {p} watched films of {a} minutes, {b} minutes and {c} minutes "
        f"and took a {brk}-minute break after each of the first two. What was the total time "
        f"in minutes?")
    return q, [f"The movies last {a} + {b} + {c} = {films} minutes.",
               f"The two breaks take 2 * {brk} = {pauses} minutes.",
               f"The marathon takes {films} + {pauses} = {films + pauses} minutes."], films + pauses


@template
def paint_cans(g: G):
    p = g.person()
    cover, walls = g.pick(50, 100, 200), g.n(2, 6)
    per_wall = cover // 2 * g.n(1, 5)
    while (per_wall * walls) % cover:
        walls += 1
    area = per_wall * walls
    q = g.pick(
        f"{p} paints {walls} walls that are each {per_wall} square feet. One can of paint "
        f"covers {cover} square feet. How many cans does {p.he} need?",
        f"How many cans of paint does {p} need for {walls} walls of {per_wall} square feet each, "
        f"if each can covers {cover} square feet?")
    return q, [f"The walls total {walls} * {per_wall} = {area} square feet.",
               f"{p.He} needs {area} / {cover} = {area // cover} cans."], area // cover


@template
def average_rainfall(g: G):
    days = g.pick(3, 4, 5)
    avg = g.n(2, 12)
    vals = [g.n(0, 2 * avg) for _ in range(days - 1)]
    last = avg * days - sum(vals)
    while last < 0:
        vals[vals.index(max(vals))] -= 1
        last = avg * days - sum(vals)
    vals.append(last)
    unit = g.pick("millimeters", "centimeters")
    listed = ", ".join(map(str, vals[:-1])) + f" and {vals[-1]}"
    q = g.pick(
        f"Over {days} days it rained {listed} {unit}. What was the average rainfall per day?",
        f"A weather station recorded {listed} {unit} of rain on {days} days. Find the mean "
        f"daily rainfall in {unit}.")
    total = avg * days
    return q, [f"The total is {' + '.join(map(str, vals))} = {total} {unit}.",
               f"The average is {total} / {days} = {avg} {unit}."], avg


@template
def elevator_boxes(g: G):
    limit, person_w, box_w = g.n(6, 12) * 100, g.n(60, 95), g.pick(10, 20, 25, 40)
    room = limit - person_w
    boxes = room // box_w
    q = g.pick(
        f"An elevator can carry at most {limit} kg. A worker weighing {person_w} kg rides with "
        f"boxes that weigh {box_w} kg each. What is the greatest number of boxes that can go "
        f"along?",
        f"A freight elevator has a {limit} kg limit. If the {person_w} kg operator is inside, "
        f"how many {box_w} kg crates can be loaded at most?")
    fit = boxes * box_w
    return q, [f"There are {limit} - {person_w} = {room} kg left for boxes.",
               f"{boxes} boxes weigh {boxes} * {box_w} = {fit} kg, which fits.",
               f"One more box would make {fit} + {box_w} = {fit + box_w} kg, more than {room} kg.",
               f"So at most {boxes} boxes can go."], boxes


@template
def tree_growth(g: G):
    p = g.person()
    h, rate, years = g.n(50, 300), g.n(10, 60), g.n(2, 9)
    grow = rate * years
    tree = g.pick("oak", "maple", "pine tree", "cherry tree", "birch")
    q = g.pick(
        f"{p}'s {tree} is {h} cm tall and grows {rate} cm each year. How tall will it be in "
        f"{years} years?",
        f"A {tree} in {p}'s yard measures {h} centimeters. If it grows {rate} centimeters a "
        f"year, what will its height be after {years} years?")
    return q, [f"It grows {rate} * {years} = {grow} cm.",
               f"It will be {h} + {grow} = {h + grow} cm tall."], h + grow


@template
def weekly_schedule_total(g: G):
    p = g.person()
    act = g.pick("swims", "practices violin", "studies Spanish", "runs", "codes")
    mon, wed, fri = g.n(20, 60, 5), g.n(20, 60, 5), g.n(20, 90, 5)
    weeks = g.n(2, 6)
    per = mon + wed + fri
    q = g.pick(
        f"{p} {act} {mon} minutes on Monday, {wed} minutes on Wednesday and {fri} minutes on "
        f"Friday. How many minutes does {p.he} spend in {weeks} weeks?",
        f"Every week {p} {act} for {mon}, {wed} and {fri} minutes on three days. What is the "
        f"total time over {weeks} weeks, in minutes?")
    return q, [f"Each week is {mon} + {wed} + {fri} = {per} minutes.",
               f"In {weeks} weeks: {per} * {weeks} = {per * weeks} minutes."], per * weeks
