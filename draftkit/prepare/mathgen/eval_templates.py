"""mathgen's EVAL-only templates: scenarios that no train template uses.

Same contract as the `train_*.py` modules: (question, step lines with `expr = result`, answer).
Acceptance measured on these problems is measured on text the draft never trained on.
"""

from __future__ import annotations

from draftkit.prepare.mathgen.phrasing import G, money, template_table

TEMPLATES, template = template_table()


@template
def gym_membership(g: G):
    p = g.person()
    signup, monthly, months = g.n(20, 80, 5), g.n(15, 45), g.n(3, 11)
    fees = monthly * months
    q = g.pick(
        f"A gym charges a {money(signup)} sign-up fee and {money(monthly)} per month. {p} joins "
        f"and cancels after {months} months. How much did {p.he} pay in total?",
        f"{p} paid a one-time {money(signup)} joining fee for a gym plus {money(monthly)} each "
        f"month for {months} months. What did the membership cost {p.him} altogether?")
    return q, [f"The monthly fees are {monthly} * {months} = ${fees}.",
               f"With the sign-up fee that is {fees} + {signup} = ${fees + signup}."], fees + signup


@template
def dog_walking(g: G):
    p = g.person()
    dogs, price, days, costs = g.n(2, 6), g.n(8, 20), g.n(3, 6), g.n(10, 40)
    per_day = dogs * price
    gross = per_day * days
    q = g.pick(
        f"{p} walks {dogs} dogs a day and charges {money(price)} per dog. {p.He} works {days} days "
        f"this week and spends {money(costs)} on leashes and treats. How much does {p.he} earn "
        f"after expenses?",
        f"Walking dogs pays {p} {money(price)} per dog. If {p.he} walks {dogs} dogs daily for "
        f"{days} days and has {money(costs)} of expenses, what is {p.his} net income?")
    return q, [f"Each day {p.he} earns {dogs} * {price} = ${per_day}.",
               f"Over {days} days: {per_day} * {days} = ${gross}.",
               f"After expenses: {gross} - {costs} = ${gross - costs}."], gross - costs


@template
def swimming_laps(g: G):
    p = g.person()
    pool, laps, days = g.pick(25, 50), g.n(10, 40), g.n(2, 6)
    each = pool * 2 * laps
    q = g.pick(
        f"{p} swims {laps} laps in a {pool}-meter pool, where one lap is there and back. "
        f"{p.He} does this {days} days a week. How many meters does {p.he} swim each week?",
        f"One lap of a {pool} m pool means swimming to the far end and back. {p} swims {laps} "
        f"laps a session and has {days} sessions a week. Find {p.his} weekly distance in meters.")
    return q, [f"One lap is 2 * {pool} = {2 * pool} meters.",
               f"A session is {2 * pool} * {laps} = {each} meters.",
               f"A week is {each} * {days} = {each * days} meters."], each * days


@template
def concert_seats(g: G):
    sections, rows, seats = g.n(2, 6), g.n(10, 30), g.n(10, 24, 2)
    pct = g.pick(50, 75, 80, 90)
    total = sections * rows * seats
    while total * pct % 100:
        rows += 1
        total = sections * rows * seats
    sold = total * pct // 100
    hall = g.pick("concert hall", "theater", "stadium", "auditorium")
    q = g.pick(
        f"A {hall} has {sections} sections, each with {rows} rows of {seats} seats. If {pct}% of "
        f"the seats are sold, how many seats are empty?",
        f"Tickets were sold for {pct}% of the seats in a {hall} with {sections} sections of "
        f"{rows} rows and {seats} seats per row. How many seats were not sold?")
    return q, [f"There are {sections} * {rows} * {seats} = {total} seats.",
               f"{total} * {pct} / 100 = {sold} seats are sold.",
               f"{total} - {sold} = {total - sold} seats are empty."], total - sold


@template
def bike_rental(g: G):
    p = g.person()
    base, hourly, hours, people = g.n(5, 15), g.n(3, 10), g.n(2, 6), g.n(3, 6)
    each = base + hourly * hours
    q = g.pick(
        f"Renting a bike costs {money(base)} plus {money(hourly)} per hour. {p} and "
        f"{people - 1} friends each rent a bike for {hours} hours. What is the total cost?",
        f"A bike shop charges a flat {money(base)} and {money(hourly)} an hour. If {people} people "
        f"rent bikes for {hours} hours, how much do they pay together?")
    return q, [f"Hourly charges are {hourly} * {hours} = ${hourly * hours} per bike.",
               f"One bike costs {base} + {hourly * hours} = ${each}.",
               f"{people} bikes cost {each} * {people} = ${each * people}."], each * people


@template
def aquarium_fish(g: G):
    p = g.person()
    start, born, sold, bought = g.n(10, 40), g.n(5, 30), g.n(3, 15), g.n(2, 10)
    after_born = start + born
    q = g.pick(
        f"{p}'s aquarium has {start} fish. {born} baby fish hatch, {p.he} sells {sold} fish to a "
        f"pet store, and then buys {bought} new ones. How many fish are in the aquarium now?",
        f"There were {start} fish in a tank. After {born} were born, {sold} were given away and "
        f"{bought} were added. How many fish does {p} have?")
    mid = after_born - sold
    return q, [f"After hatching: {start} + {born} = {after_born} fish.",
               f"After selling: {after_born} - {sold} = {mid} fish.",
               f"After buying: {mid} + {bought} = {mid + bought} fish."], mid + bought


@template
def training_plan(g: G):
    p = g.person()
    first, inc, weeks = g.n(2, 6), g.n(1, 3), g.pick(3, 4, 5)
    runs = [first + inc * i for i in range(weeks)]
    total = sum(runs)
    q = g.pick(
        f"{p} is training for a race. The first week {p.he} runs {first} km, and each week after "
        f"that {p.he} runs {inc} km more than the week before. How many km does {p.he} run in "
        f"{weeks} weeks?",
        f"In week one of a running plan {p} covers {first} kilometers, adding {inc} km every "
        f"following week. What total distance does {p.he} run over {weeks} weeks?")
    steps = [f"Week {i + 1}: {runs[i - 1]} + {inc} = {runs[i]} km." for i in range(1, weeks)]
    return q, steps + [f"Total: {' + '.join(map(str, runs))} = {total} km."], total


@template
def candle_burning(g: G):
    rate, hours = g.n(1, 4), g.n(2, 6)
    left = g.n(3, 15)
    height = left + rate * hours
    q = g.pick(
        f"A candle is {height} cm tall and burns down {rate} cm every hour. How tall is it after "
        f"burning for {hours} hours?",
        f"A {height}-centimeter candle gets {rate} cm shorter each hour it burns. What is its "
        f"height after {hours} hours?")
    burned = rate * hours
    return q, [f"It burns {rate} * {hours} = {burned} cm.",
               f"It is {height} - {burned} = {left} cm tall."], left


@template
def printer_jobs(g: G):
    ppm = g.pick(10, 12, 15, 20, 30)
    jobs = [ppm * g.n(1, 6) for _ in range(3)]
    total = sum(jobs)
    q = g.pick(
        f"An office printer prints {ppm} pages per minute. It has three jobs of {jobs[0]}, "
        f"{jobs[1]} and {jobs[2]} pages. How many minutes does it take to print all of them?",
        f"Three documents with {jobs[0]}, {jobs[1]} and {jobs[2]} pages are sent to a printer "
        f"that prints {ppm} pages a minute. How long, in minutes, will printing take?")
    return q, [f"There are {jobs[0]} + {jobs[1]} + {jobs[2]} = {total} pages.",
               f"It takes {total} / {ppm} = {total // ppm} minutes."], total // ppm


@template
def orchard_bags(g: G):
    p = g.person()
    fruit = g.pick("apples", "pears", "peaches", "oranges")
    bag, price = g.pick(5, 6, 8, 10), g.n(3, 8)
    trees = g.n(4, 12)
    per_tree = bag * g.n(3, 9)
    total = trees * per_tree
    bags = total // bag
    q = g.pick(
        f"{p}'s orchard has {trees} trees, and each tree gives {per_tree} {fruit}. {p.He} packs "
        f"them in bags of {bag} and sells each bag for {money(price)}. How much money does "
        f"{p.he} make?",
        f"From {trees} trees with {per_tree} {fruit} each, {p} fills bags of {bag} {fruit}. At "
        f"{money(price)} a bag, what are {p.his} total sales?")
    return q, [f"There are {trees} * {per_tree} = {total} {fruit}.",
               f"They fill {total} / {bag} = {bags} bags.",
               f"The bags sell for {bags} * {price} = ${bags * price}."], bags * price


@template
def doubling_jar(g: G):
    p = g.person()
    start, weeks = g.n(1, 9), g.pick(3, 4, 5)
    vals = [start * 2 ** i for i in range(weeks + 1)]
    q = g.pick(
        f"{p} puts {money(start)} in a jar. Every week {p.he} doubles the amount in the jar. "
        f"How much money is in the jar after {weeks} weeks?",
        f"A savings jar starts with {money(start)}, and the amount in it doubles each week. "
        f"What does {p}'s jar hold after {weeks} weeks?")
    steps = [f"After week {i}: {vals[i - 1]} * 2 = ${vals[i]}." for i in range(1, weeks + 1)]
    return q, steps, vals[-1]


@template
def carpool_split(g: G):
    p = g.person()
    miles, mpg, gas, tolls = g.n(60, 300, 10), g.pick(20, 25, 30), g.pick(3, 4), g.n(2, 12)
    friends = g.n(3, 5)
    while miles % mpg:
        miles += 10
    gallons = miles // mpg
    cost = gallons * gas + tolls
    while cost % friends:
        tolls += 1
        cost = gallons * gas + tolls
    q = g.pick(
        f"{p} and {friends - 1} friends drive {miles} miles. The car uses one gallon every "
        f"{mpg} miles, gas is {money(gas)} a gallon, and tolls cost {money(tolls)}. They split the "
        f"cost equally. How much does each person pay?",
        f"A carpool of {friends} people shares a {miles}-mile trip. The car gets {mpg} miles per "
        f"gallon, gas costs {money(gas)} per gallon, and tolls add {money(tolls)}. What is each "
        f"person's share?")
    fuel = gallons * gas
    return q, [f"They use {miles} / {mpg} = {gallons} gallons.",
               f"Gas costs {gallons} * {gas} = ${fuel}.",
               f"With tolls: {fuel} + {tolls} = ${cost}.",
               f"Each pays {cost} / {friends} = ${cost // friends}."], cost // friends


@template
def hotel_stay(g: G):
    p = g.person()
    nights, rate, people, breakfast = g.n(2, 6), g.n(60, 150, 5), g.n(1, 4), g.n(8, 15)
    room = nights * rate
    food = breakfast * people * nights
    q = g.pick(
        f"A hotel room costs {money(rate)} per night, and breakfast is {money(breakfast)} per "
        f"person per day. {p} stays {nights} nights with {people} people eating breakfast each "
        f"day. What is the bill?",
        f"{p} books {nights} nights at {money(rate)} a night and adds breakfast for {people} "
        f"people at {money(breakfast)} each per day. How much is the total?")
    return q, [f"The room costs {nights} * {rate} = ${room}.",
               f"Breakfast costs {breakfast} * {people} * {nights} = ${food}.",
               f"The bill is {room} + {food} = ${room + food}."], room + food


@template
def typing_essay(g: G):
    p = g.person()
    wpm = g.pick(20, 25, 30, 40, 50)
    words = wpm * g.n(10, 40)
    breaks, brk = g.n(2, 4), g.pick(5, 10)
    typing = words // wpm
    q = g.pick(
        f"{p} types {wpm} words per minute. {p.His} essay is {words} words long, and {p.he} takes "
        f"{breaks} breaks of {brk} minutes each. How many minutes does it take {p.him} to finish?",
        f"An essay of {words} words is typed at {wpm} words a minute, with {breaks} breaks of "
        f"{brk} minutes. How long does {p} spend in total, in minutes?")
    rest = breaks * brk
    return q, [f"Typing takes {words} / {wpm} = {typing} minutes.",
               f"Breaks take {breaks} * {brk} = {rest} minutes.",
               f"Total: {typing} + {rest} = {typing + rest} minutes."], typing + rest


@template
def bookshelf_shelves(g: G):
    p = g.person()
    shelves, per_shelf, new_boxes, per_box = g.n(3, 7), g.n(15, 40), g.n(2, 5), g.n(5, 20)
    incoming = new_boxes * per_box
    while shelves * per_shelf < incoming + 40:
        shelves += 1
    cap = shelves * per_shelf
    have = cap - g.n(incoming, incoming + 30)
    q = g.pick(
        f"{p}'s bookcase has {shelves} shelves that hold {per_shelf} books each. {p.He} has "
        f"{have} books on it and receives {new_boxes} boxes with {per_box} books each. How many "
        f"more books could still fit?",
        f"A bookcase with {shelves} shelves of {per_shelf} books holds {have} books. After "
        f"{new_boxes} boxes of {per_box} books are added, how much room is left, in books?")
    left = cap - have - incoming
    return q, [f"The bookcase holds {shelves} * {per_shelf} = {cap} books.",
               f"The new books number {new_boxes} * {per_box} = {incoming}.",
               f"Room left: {cap} - {have} - {incoming} = {left} books."], left
