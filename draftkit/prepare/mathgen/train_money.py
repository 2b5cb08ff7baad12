"""mathgen TRAIN templates: shopping, wages, bills, savings and profit (none appears in `eval_templates.py`).

A template takes a `G` (seeded choices) and returns (question, step lines, answer). Each step
writes its arithmetic as `expr = result` so tests can re-check every line. Numbers are drawn
so every division is exact and every answer is a non-negative integer.
"""

from __future__ import annotations

from draftkit.prepare.mathgen.phrasing import G, money, template_table

TEMPLATES, template = template_table()


@template
def change_from_bill(g: G):
    p, it = g.person(), g.item("snack")
    n, price = g.n(2, 9), g.n(2, 12)
    total = n * price
    bill = min(b for b in (20, 50, 100, 200) if b > total)
    change = bill - total
    q = g.pick(
        f"{g.opener()}{p} buys {n} {it.pl} that cost {money(price)} each. {p.He} pays with a "
        f"{money(bill)} bill. How much change does {p.he} get back?",
        f"At the bakery, {p} picks up {n} {it.pl} priced at {money(price)} apiece and hands the "
        f"cashier {money(bill)}. How much change should {p} receive?",
        f"{it.Pl} cost {money(price)} each. If {p} buys {n} of them and pays with "
        f"{money(bill)}, how many dollars of change will {p.he} get?")
    return q, [f"The {it.pl} cost {n} * {price} = ${total}.",
               f"{p}'s change is {bill} - {total} = ${change}."], change


@template
def overtime_pay(g: G):
    p = g.person()
    rate, extra = g.n(10, 30, 2), g.n(2, 12)
    hours = 40 + extra
    regular, ot_rate = 40 * rate, rate * 3 // 2
    ot = extra * ot_rate
    q = g.pick(
        f"{p} earns {money(rate)} an hour. For every hour over 40 in a week, {p.he} is paid "
        f"time and a half. How much does {p.he} earn in a week when {p.he} works {hours} hours?",
        f"{p}'s job pays {money(rate)} per hour, and overtime (hours beyond 40 each week) pays "
        f"1.5 times the normal rate. If {p} worked {hours} hours this week, what was {p.his} pay?",
        f"Calculate {p}'s weekly pay: {p.he} worked {hours} hours at {money(rate)} per hour, "
        f"with any hours above 40 paid at one and a half times the hourly rate.")
    return q, [f"For the first 40 hours {p.he} earns 40 * {rate} = ${regular}.",
               f"{p.He} worked {hours} - 40 = {extra} overtime hours.",
               f"The overtime rate is {rate} * 1.5 = ${ot_rate} per hour.",
               f"Overtime pay is {extra} * {ot_rate} = ${ot}.",
               f"In total {p.he} earns {regular} + {ot} = ${regular + ot}."], regular + ot


@template
def saving_for_item(g: G):
    p = g.person()
    thing = g.pick("bike", "tablet", "guitar", "skateboard", "telescope", "camera")
    weekly, weeks = g.n(5, 25), g.n(3, 12)
    have = g.n(10, 90, 5)
    cost = have + weekly * weeks
    need = cost - have
    q = g.pick(
        f"{p} wants a {thing} that costs {money(cost)}. {p.He} already has {money(have)} and "
        f"saves {money(weekly)} each week. How many weeks will it take {p.him} to have enough?",
        f"A {thing} costs {money(cost)}. {p} has saved {money(have)} so far and puts away "
        f"{money(weekly)} every week. In how many weeks can {p.he} buy the {thing}?",
        f"{p} is saving up for a {money(cost)} {thing}. Starting with {money(have)}, {p.he} adds "
        f"{money(weekly)} per week. How many weeks does {p.he} need to save?")
    return q, [f"{p} still needs {cost} - {have} = ${need}.",
               f"It takes {need} / {weekly} = {weeks} weeks."], weeks


@template
def percent_discount(g: G):
    p, it = g.person(), g.item("clothing")
    price = g.n(20, 80, 4)
    pct = g.pick(*[d for d in (10, 20, 25, 30, 40, 50) if price * d % 100 == 0])
    n = g.n(2, 5)
    off = price * pct // 100
    each = price - off
    q = g.pick(
        f"A {it.s} normally costs {money(price)}. During a sale everything is {pct}% off. How "
        f"much does {p} pay for {n} {it.pl}?",
        f"{p} buys {n} {it.pl} at {pct}% off. The regular price of one {it.s} is "
        f"{money(price)}. What is the total cost?",
        f"The store takes {pct}% off {it.pl} that usually sell for {money(price)} each. How "
        f"much will {n} {it.pl} cost {p}?")
    return q, [f"The discount is {price} * {pct} / 100 = ${off} per {it.s}.",
               f"Each {it.s} costs {price} - {off} = ${each}.",
               f"{n} {it.pl} cost {n} * {each} = ${n * each}."], n * each


@template
def bakery_profit(g: G):
    p = g.person()
    n, cost, price = g.n(20, 60), g.n(1, 3), g.n(5, 9)
    unsold = g.n(1, n // 4)
    sold = n - unsold
    thing = g.pick("loaves of bread", "pies", "cakes", "jars of jam")
    q = g.pick(
        f"{p} bakes {n} {thing}. Each costs {money(cost)} to make and sells for {money(price)}. "
        f"{p.He} sells all but {unsold}. What is {p.his} profit?",
        f"It costs {p} {money(cost)} to make each of {n} {thing}. {p.He} sells {sold} of them at "
        f"{money(price)} each. How much profit does {p.he} make?")
    return q, [f"Making them costs {n} * {cost} = ${n * cost}.",
               f"{p.He} sells {n} - {unsold} = {sold} for {sold} * {price} = ${sold * price}.",
               f"The profit is {sold * price} - {n * cost} = ${sold * price - n * cost}."], (
        sold * price - n * cost)


@template
def phone_bill(g: G):
    p = g.person()
    base, limit, per = g.n(15, 40), g.n(2, 10), g.n(3, 10)
    used = limit + g.n(1, 8)
    over = used - limit
    q = g.pick(
        f"{p}'s phone plan costs {money(base)} a month and includes {limit} GB of data. Each "
        f"extra GB costs {money(per)}. This month {p.he} used {used} GB. What is {p.his} bill?",
        f"A phone plan has a {money(base)} monthly fee with {limit} GB included and charges "
        f"{money(per)} per GB over that. How much does {p} pay after using {used} GB?")
    return q, [f"{p.He} used {used} - {limit} = {over} extra GB.",
               f"The extra data costs {over} * {per} = ${over * per}.",
               f"The bill is {base} + {over * per} = ${base + over * per}."], base + over * per


@template
def tickets_family(g: G):
    p = g.person()
    adult, child = g.n(8, 20), g.n(3, 9)
    na, nc = g.n(1, 4), g.n(1, 6)
    place = g.pick("the zoo", "the museum", "the aquarium", "a water park", "the movies")
    q = g.pick(
        f"Tickets to {place} cost {money(adult)} for adults and {money(child)} for children. "
        f"{p} buys tickets for {na} adults and {nc} children. How much does {p.he} spend?",
        f"{p} takes {na} adults and {nc} kids to {place}. Adult tickets are {money(adult)} and "
        f"kids' tickets are {money(child)}. What is the total ticket cost?")
    a, c = na * adult, nc * child
    return q, [f"Adult tickets cost {na} * {adult} = ${a}.",
               f"Child tickets cost {nc} * {child} = ${c}.",
               f"Altogether {a} + {c} = ${a + c}."], a + c


@template
def lemonade_stand(g: G):
    p = g.person()
    days, cups, price = g.n(2, 5), g.n(10, 40), g.pick(1, 2, 3)
    supplies = g.n(5, 25)
    revenue = days * cups * price
    q = g.pick(
        f"{p} sells {cups} cups of lemonade a day for {days} days at {money(price)} a cup. "
        f"Supplies cost {money(supplies)}. How much money does {p.he} make after paying for "
        f"supplies?",
        f"For {days} days, {p} sold {cups} cups of lemonade daily at {money(price)} each. "
        f"{p.He} spent {money(supplies)} on lemons and sugar. What was {p.his} profit?")
    sold = days * cups
    return q, [f"{p.He} sold {days} * {cups} = {sold} cups.",
               f"{p.He} earned {sold} * {price} = ${revenue}.",
               f"The profit is {revenue} - {supplies} = ${revenue - supplies}."], revenue - supplies


@template
def allowance_weeks(g: G):
    p = g.person()
    pay, chores, spend = g.n(2, 6), g.n(3, 8), g.n(1, 5)
    weekly = pay * chores - spend
    while weekly <= 0:
        chores += 1
        weekly = pay * chores - spend
    weeks = g.n(3, 10)
    goal = weekly * weeks
    thing = g.pick("video game", "pair of sneakers", "concert ticket", "drone", "backpack")
    q = g.pick(
        f"{p} earns {money(pay)} for each chore and does {chores} chores a week. {p.He} spends "
        f"{money(spend)} each week on snacks. How many weeks until {p.he} can buy a "
        f"{money(goal)} {thing}?",
        f"A {thing} costs {money(goal)}. {p} gets {money(pay)} per chore, does {chores} chores "
        f"weekly, and spends {money(spend)} a week. How many weeks must {p.he} save?")
    earn = pay * chores
    return q, [f"{p.He} earns {pay} * {chores} = ${earn} a week.",
               f"{p.He} saves {earn} - {spend} = ${weekly} a week.",
               f"{goal} / {weekly} = {weeks} weeks."], weeks


@template
def coins_cents(g: G):
    p = g.person()
    qs, ds, ns = g.n(2, 12), g.n(2, 15), g.n(1, 10)
    a, b, c = qs * 25, ds * 10, ns * 5
    q = g.pick(
        f"{p} has {qs} quarters, {ds} dimes and {ns} nickels. How many cents does {p.he} have?",
        f"In {p}'s piggy bank there are {qs} quarters, {ds} dimes and {ns} nickels. What is the "
        f"total value in cents?")
    return q, [f"Quarters: {qs} * 25 = {a} cents.", f"Dimes: {ds} * 10 = {b} cents.",
               f"Nickels: {ns} * 5 = {c} cents.", f"Total: {a} + {b} + {c} = {a + b + c} cents."], (
        a + b + c)


@template
def library_late_fee(g: G):
    p = g.person()
    books, days, cents = g.n(2, 6), g.n(3, 14), g.pick(10, 20, 25, 50)
    total = books * days * cents
    while total % 100:
        days += 1
        total = books * days * cents
    q = g.pick(
        f"{p} returned {books} library books {days} days late. The fine is {cents} cents per "
        f"book per day. How many dollars does {p.he} owe?",
        f"The library charges {cents} cents a day for each late book. {p} kept {books} books "
        f"{days} days too long. What is the fine in dollars?")
    per = books * cents
    return q, [f"Each day costs {books} * {cents} = {per} cents.",
               f"Over {days} days that is {per} * {days} = {total} cents.",
               f"{total} / 100 = ${total // 100}."], total // 100


@template
def fuel_cost(g: G):
    p = g.person()
    mpg, gallons, price = g.n(20, 40, 5), g.n(3, 12), g.pick(3, 4, 5)
    miles = mpg * gallons
    q = g.pick(
        f"{p}'s car gets {mpg} miles per gallon. Gas costs {money(price)} per gallon. How much "
        f"does gas cost for a {miles}-mile trip?",
        f"{p} drives {miles} miles in a car that goes {mpg} miles on a gallon of gas. If a "
        f"gallon costs {money(price)}, how much does {p.he} spend on gas?")
    return q, [f"The trip uses {miles} / {mpg} = {gallons} gallons.",
               f"The gas costs {gallons} * {price} = ${gallons * price}."], gallons * price


@template
def salary_raise(g: G):
    p = g.person()
    monthly, pct = g.n(20, 60) * 100, g.pick(5, 10, 20)
    inc = monthly * pct // 100
    new = monthly + inc
    q = g.pick(
        f"{p} earns {money(monthly)} a month and gets a {pct}% raise. How much will {p.he} earn "
        f"in a year at the new salary?",
        f"After a {pct}% raise on a monthly salary of {money(monthly)}, what is {p}'s yearly "
        f"pay?")
    return q, [f"The raise is {monthly} * {pct} / 100 = ${inc}.",
               f"The new monthly pay is {monthly} + {inc} = ${new}.",
               f"In a year {p.he} earns {new} * 12 = ${new * 12}."], new * 12


@template
def compare_stores(g: G):
    p, it = g.person(), g.item("supply")
    n = g.n(3, 12)
    a, b = g.n(2, 9), g.n(2, 9)
    while a == b:
        b = g.n(2, 9)
    fee = g.n(1, 5)
    ta, tb = n * a, n * b + fee
    while ta == tb:
        fee += 1
        tb = n * b + fee
    q = g.pick(
        f"{p} needs {n} {it.pl}. Store A sells them for {money(a)} each. Store B sells them for "
        f"{money(b)} each plus a {money(fee)} delivery fee. How much money does {p.he} save by "
        f"choosing the cheaper store?",
        f"{it.Pl} cost {money(a)} each at one shop, and {money(b)} each plus {money(fee)} "
        f"shipping online. For {n} {it.pl}, what is the difference between the two totals?")
    return q, [f"Store A: {n} * {a} = ${ta}.", f"Store B: {n} * {b} + {fee} = ${tb}.",
               f"The difference is {max(ta, tb)} - {min(ta, tb)} = ${abs(ta - tb)}."], abs(ta - tb)


@template
def subscription_savings(g: G):
    p = g.person()
    monthly = g.n(6, 20)
    yearly = monthly * 12 - g.n(10, 40)
    service = g.pick("music streaming", "video streaming", "cloud storage", "language app")
    q = g.pick(
        f"A {service} plan costs {money(monthly)} per month or {money(yearly)} per year. How "
        f"much does {p} save in a year by paying yearly?",
        f"{p} can pay {money(monthly)} each month for {service}, or {money(yearly)} once for the "
        f"year. How many dollars does the yearly plan save?")
    m = monthly * 12
    return q, [f"Paying monthly costs {monthly} * 12 = ${m} a year.",
               f"The saving is {m} - {yearly} = ${m - yearly}."], m - yearly


@template
def shared_bill_tip(g: G):
    p = g.person()
    people = g.n(3, 6)
    each_food = g.n(8, 25)
    food = people * each_food
    tip_pct = g.pick(10, 20)
    tip = food * tip_pct // 100
    while food * tip_pct % 100 or (food + tip) % people:
        food += people
        tip = food * tip_pct // 100
    share = (food + tip) // people
    q = g.pick(
        f"{p} and {people - 1} friends eat dinner. The food costs {money(food)} and they add a "
        f"{tip_pct}% tip. If they split the total evenly, how much does each person pay?",
        f"A meal for {people} people costs {money(food)} before a {tip_pct}% tip. Split evenly, "
        f"what is each person's share?")
    return q, [f"The tip is {food} * {tip_pct} / 100 = ${tip}.",
               f"The total is {food} + {tip} = ${food + tip}.",
               f"Each pays {food + tip} / {people} = ${share}."], share


@template
def unit_price_pack(g: G):
    p, it = g.person(), g.item("fruit")
    per_bag, bag_price, bags = g.pick(4, 5, 6, 8), g.n(3, 9), g.n(2, 7)
    count = per_bag * bags
    q = g.pick(
        f"{it.Pl} come in bags of {per_bag} that cost {money(bag_price)} per bag. {p} needs "
        f"{count} {it.pl}. How much will {p.he} spend?",
        f"{p} wants {count} {it.pl}. The market sells them only in bags of {per_bag} for "
        f"{money(bag_price)} a bag. What is the cost?")
    return q, [f"{p.He} needs {count} / {per_bag} = {bags} bags.",
               f"They cost {bags} * {bag_price} = ${bags * bag_price}."], bags * bag_price
